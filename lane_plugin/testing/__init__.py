"""Test helpers shipped with lane_plugin: a local OpenAI-compatible provider with OpenAI's rate limits.

Example:
    >>> from lane_plugin.testing import ProviderEmulator                     # doctest: +SKIP
    >>> with ProviderEmulator(tpm=10_000, window_seconds=6) as emu:          # doctest: +SKIP
    ...     client = OpenAI(base_url=emu.base_url, api_key="x")
"""

from .limits import Limits, Record, count_tokens, find_trace, load_trace, max_in_window
from .provider import ProviderEmulator

__all__ = ["Limits", "ProviderEmulator", "Record", "count_tokens", "find_trace", "load_trace", "max_in_window"]
