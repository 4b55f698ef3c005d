"""Exact input tokens, offline: count a prompt or chat messages as OpenAI does.

The tokenizer is chosen from a model name (:func:`encoding_for_model`) and
loaded from what is already on the machine, never downloaded:

1. ``bpe-openai`` (``pip install 'lane-plugin[tokens]'``), which ships the
   ``cl100k_base`` and ``o200k_base`` vocabularies inside its wheel;
2. else ``tiktoken``, only if the encoding's file is already in its local cache
   (``TIKTOKEN_CACHE_DIR``; see :func:`~lane_plugin.estimators.load_local_encoding`);
3. else characters / 4, with ONE warning per process (logger
   ``lane_plugin.estimators``) naming what to install.

Chat messages are counted the way the OpenAI cookbook's
``num_tokens_from_messages`` counts them ("How to count tokens with tiktoken"):
3 tokens per message (``<|start|>{role}\\n ... <|end|>``), the tokens of every
string field (role, content, name), 1 more for a ``name``, and 3 for the
priming of the reply (``<|start|>assistant<|message|>``). Its sample
conversation counts 129 prompt tokens on gpt-4 / gpt-3.5-turbo (cl100k_base)
and 124 on gpt-4o (o200k_base), as the API reported; tools count as the
cookbook's ``num_tokens_for_tools`` (105 and 101 for its weather example).
Content parts that are not text (images, audio, files) are not counted: the
provider prices them by size, which the text does not tell. The learned
estimator (:func:`~lane_plugin.estimators.learned`) learns what a stage costs
beyond the counted input, so such a gap shows up in its allowance, not as drift.

Example:
    >>> counter = TokenCounter("gpt-4o")
    >>> counter.encoding, counter.backend in ("bpe-openai", "tiktoken", "chars/4")
    ('o200k_base', True)
    >>> count_tokens("hello world", model="gpt-4o")          # doctest: +SKIP
    2
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from functools import cache, lru_cache
from typing import Any

from ..errors import InvalidInput, TiktokenUnavailable
from .basic import load_local_encoding

log = logging.getLogger("lane_plugin.estimators")

#: The encoding for a model name nothing below matches: every OpenAI chat model since gpt-4o uses it.
DEFAULT_ENCODING = "o200k_base"
ENCODINGS = ("o200k_base", "cl100k_base")
# Model-name prefixes (after any "provider/" prefix), first match wins: the newer names first.
_MODEL_PREFIXES = (
    ("gpt-4o", "o200k_base"),
    ("chatgpt-4o", "o200k_base"),
    ("gpt-4.1", "o200k_base"),
    ("gpt-4.5", "o200k_base"),
    ("gpt-5", "o200k_base"),
    ("gpt-oss", "o200k_base"),
    ("o1", "o200k_base"),
    ("o3", "o200k_base"),
    ("o4", "o200k_base"),
    ("codex", "o200k_base"),
    ("gpt-4", "cl100k_base"),
    ("gpt-3.5", "cl100k_base"),
    ("gpt-35", "cl100k_base"),
    ("text-embedding-3", "cl100k_base"),
    ("text-embedding-ada-002", "cl100k_base"),
)
TOKENS_PER_MESSAGE = 3  # <|start|>{role}\n{content}<|end|>
TOKENS_PER_NAME = 1
REPLY_PRIMING = 3  # <|start|>assistant<|message|>
# num_tokens_for_tools (OpenAI cookbook): per-encoding overheads of a function definition.
_TOOL_OVERHEAD = {
    "o200k_base": dict(func_init=7, prop_init=3, prop_key=3, enum_init=-3, enum_item=3, func_end=12),
    "cl100k_base": dict(func_init=10, prop_init=3, prop_key=3, enum_init=-3, enum_item=3, func_end=12),
}
_PIECE = 40_000  # characters per encode call: bpe-openai refuses more than 200,000 tokens at once
# The fallback is warned about once per process, by the call that draws 0: ``next`` on a count is one C call, so
# no Python-level lock or Event (whose Condition an exception raised into the thread, a Prefect timeout, can leave
# held: every later fallback would then wait for ever) guards it.
_warn_turns = itertools.count()


def encoding_for_model(model: str | None) -> str:
    """The OpenAI encoding of a model name; :data:`DEFAULT_ENCODING` for a name it does not know.

    ``gpt-4o*``, ``o1*``, ``o3*``, ``o4*``, ``gpt-4.1*``, ``gpt-4.5*``, ``gpt-5*`` are
    ``o200k_base``; ``gpt-4*`` and ``gpt-3.5*`` are ``cl100k_base``. A provider
    prefix (``openai/gpt-4o``, ``azure/gpt-4``) is ignored, and an encoding name
    is taken as itself. Other families (Claude, Llama, Gemini) have tokenizers
    of their own: ``o200k_base`` is an approximation there.

    Example:
        >>> encoding_for_model("gpt-4o-mini"), encoding_for_model("openai/gpt-4-0613"), encoding_for_model(None)
        ('o200k_base', 'cl100k_base', 'o200k_base')
    """
    if model is None:
        return DEFAULT_ENCODING
    if not isinstance(model, str) or not model.strip():
        raise InvalidInput("model", model, "expected a model name such as 'gpt-4o'")
    name = model.strip().lower().rsplit("/", 1)[-1]
    if name in ENCODINGS:
        return name
    for prefix, encoding in _MODEL_PREFIXES:
        if name.startswith(prefix):
            return encoding
    return DEFAULT_ENCODING


@cache
def _bpe_openai(encoding: str):
    try:
        import bpe_openai
    except ImportError:
        return None
    return bpe_openai.get_encoding(encoding)


@cache
def _tiktoken(encoding: str):
    try:
        return load_local_encoding(encoding)
    except TiktokenUnavailable:
        return None


def _warn_fallback(encoding: str) -> None:
    if next(_warn_turns):
        return
    log.warning(
        "lane_plugin: no local tokenizer for %s (pip install 'lane-plugin[tokens]' installs bpe-openai, "
        "which ships it); counting input tokens as characters / 4, which can be far off for code, "
        "non-English text and JSON. This warning is logged once per process.",
        encoding,
    )


class TokenCounter:
    """Counts tokens of text and chat messages with the best tokenizer found locally.

    Args:
        model: a model name (``gpt-4o``, ``gpt-4``); picks the encoding (:func:`encoding_for_model`).
        encoding: the encoding itself (``o200k_base`` or ``cl100k_base``), instead of ``model``.
        backend: ``auto`` (bpe-openai, else a cached tiktoken file, else chars/4),
            or one of ``bpe-openai``, ``tiktoken``, ``chars/4`` to insist on it
            (a missing one raises :class:`~lane_plugin.errors.TiktokenUnavailable`).

    ``label`` names what counts (``o200k_base``, or ``chars4`` for the fallback);
    estimators put it in their version, so numbers from different counters are
    never mixed up.

    Example:
        >>> TokenCounter(encoding="cl100k_base", backend="chars/4").count("x" * 40)
        10
    """

    BACKENDS = ("auto", "bpe-openai", "tiktoken", "chars/4")

    def __init__(self, model: str | None = None, *, encoding: str | None = None, backend: str = "auto"):
        if encoding is not None and encoding not in ENCODINGS:
            raise InvalidInput("encoding", encoding, f"expected one of {', '.join(ENCODINGS)}")
        if backend not in self.BACKENDS:
            raise InvalidInput("backend", backend, f"expected one of {', '.join(self.BACKENDS)}")
        self.model = model
        self.encoding = encoding or encoding_for_model(model)
        self._enc = None
        if backend in ("auto", "bpe-openai"):
            self._enc, self.backend = _bpe_openai(self.encoding), "bpe-openai"
            if self._enc is None and backend == "bpe-openai":
                raise TiktokenUnavailable(
                    "backend", backend, "bpe-openai is not installed (pip install 'lane-plugin[tokens]')"
                )
        if self._enc is None and backend in ("auto", "tiktoken"):
            if backend == "tiktoken":
                self._enc = load_local_encoding(self.encoding)
            else:
                self._enc = _tiktoken(self.encoding)
            self.backend = "tiktoken"
        if self._enc is None:
            self.backend = "chars/4"
            if backend == "auto":
                _warn_fallback(self.encoding)
        self.label = "chars4" if self._enc is None else self.encoding

    def __repr__(self) -> str:
        return f"TokenCounter(encoding={self.encoding!r}, backend={self.backend!r})"

    # -- text -------------------------------------------------------------------------
    def count(self, text: str) -> int:
        """Tokens of a string as the model reads it (special-token text counts as plain text)."""
        if not isinstance(text, str):
            raise InvalidInput("text", text, "expected a string")
        if not text:
            return 0
        if self._enc is None:
            return math.ceil(len(text) / 4)
        return sum(len(self._enc.encode(piece, disallowed_special=())) for piece in _pieces(text))

    # -- chat -------------------------------------------------------------------------
    def count_messages(self, messages: Sequence[Any], *, tools: Sequence[Any] | None = None) -> int:
        """Prompt tokens of a chat request: its messages (and tools) as OpenAI counts them.

        A message is a mapping or an object with ``role``, ``content`` and
        optionally ``name``; content may be a string or a list of parts, whose
        ``text`` parts are counted. ``tool_calls`` of assistant messages count
        their function names and arguments.

        Example:
            >>> c = TokenCounter(encoding="o200k_base", backend="chars/4")
            >>> c.count_messages([{"role": "user", "content": "x" * 8}])   # 3 + 1 (role) + 2 + 3
            9
        """
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise InvalidInput("messages", messages, "expected a list of chat messages")
        total = 0
        for i, message in enumerate(messages):
            total += TOKENS_PER_MESSAGE
            fields = _message_fields(message, i)
            for key, value in fields.items():
                total += self._count_value(value)
                if key == "name":
                    total += TOKENS_PER_NAME
        total += REPLY_PRIMING
        if tools:
            total += self.count_tools(tools)
        return total

    def _count_value(self, value: Any) -> int:
        if value is None:
            return 0
        if isinstance(value, str):
            return self.count(value)
        if isinstance(value, Mapping):
            if "text" in value and isinstance(value["text"], str):
                return self.count(value["text"])
            if "function" in value:  # a tool call
                fn = value["function"] or {}
                return self.count(str(_get(fn, "name") or "")) + self.count(str(_get(fn, "arguments") or ""))
            return 0  # an image, audio or file part: priced by size, not text
        if isinstance(value, Sequence):
            return sum(self._count_value(v) for v in value)
        return self._count_value(_as_mapping(value))

    def count_tools(self, tools: Sequence[Any]) -> int:
        """Tokens the function definitions of a request add (the cookbook's ``num_tokens_for_tools``)."""
        o = _TOOL_OVERHEAD.get(self.encoding, _TOOL_OVERHEAD["o200k_base"])
        total = 0
        for i, tool in enumerate(tools):
            fn = _get(_as_mapping(tool), "function")
            if not isinstance(fn, Mapping):
                raise InvalidInput(f"tools[{i}]", tool, "expected {'type': 'function', 'function': {...}}")
            total += o["func_init"]
            desc = str(fn.get("description") or "").removesuffix(".")
            total += self.count(f"{fn.get('name', '')}:{desc}")
            props = ((fn.get("parameters") or {}).get("properties")) or {}
            if props:
                total += o["prop_init"]
                for key, prop in props.items():
                    total += o["prop_key"]
                    if "enum" in prop:
                        total += o["enum_init"]
                        for item in prop["enum"]:
                            total += o["enum_item"] + self.count(str(item))
                    pdesc = str(prop.get("description") or "").removesuffix(".")
                    total += self.count(f"{key}:{prop.get('type', '')}:{pdesc}")
        return total + (o["func_end"] if tools else 0)

    def count_prompt(self, prompt: Any, *, tools: Sequence[Any] | None = None) -> int:
        """Tokens of a prompt: a string, a list of chat messages, or a list of strings.

        Example:
            >>> c = TokenCounter(backend="chars/4")
            >>> c.count_prompt("x" * 40), c.count_prompt(["x" * 40, "y" * 40])
            (10, 20)
        """
        if prompt is None:
            return 0
        if isinstance(prompt, str):
            return self.count(prompt)
        if isinstance(prompt, Sequence) and prompt and all(isinstance(p, str) for p in prompt):
            return sum(self.count(p) for p in prompt)
        if isinstance(prompt, Sequence):
            return self.count_messages(prompt, tools=tools)
        if isinstance(prompt, Mapping) and "messages" in prompt:  # a request body
            return self.count_messages(prompt["messages"], tools=prompt.get("tools") or tools)
        raise InvalidInput("prompt", prompt, "expected a string, a list of strings or a list of chat messages")


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def _as_mapping(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return obj
    dump = getattr(obj, "model_dump", None)  # pydantic models: the SDKs' own message types
    if callable(dump):
        return dump(exclude_none=True)
    if hasattr(obj, "__dict__"):
        return {k: v for k, v in vars(obj).items() if not k.startswith("_")}
    return {}


def _message_fields(message: Any, i: int) -> dict:
    m = _as_mapping(message)
    if not isinstance(m, Mapping) or "role" not in m:
        raise InvalidInput(f"messages[{i}]", message, "expected a chat message with a role")
    out = {}
    for key, value in m.items():
        if key == "tool_calls":
            out[key] = [_as_mapping(c) for c in value or ()]
        elif isinstance(value, (str, list, tuple)) or value is None:
            out[key] = value
        elif isinstance(value, Mapping):
            out[key] = json.dumps(value, sort_keys=True)  # e.g. an audio reference: counted as its text
    return out


_SPLIT = re.compile(r"(?<=\S)[ \n](?=\S)")


def _pieces(text: str):
    """``text`` in pieces of at most ``_PIECE`` characters, cut before a lone space or newline.

    BPE pre-tokenisation splits there anyway, so the pieces' counts add up to
    the whole's (a text with no such place is cut where it must be).
    """
    start = 0
    n = len(text)
    while n - start > _PIECE:
        end = start + _PIECE
        cut = None
        for m in _SPLIT.finditer(text, max(start + 1, end - 2_000), end):
            cut = m.start()
        end = cut if cut is not None and cut > start else end
        yield text[start:end]
        start = end
    yield text[start:]


@lru_cache(maxsize=16)
def counter_for(model: str | None = None, encoding: str | None = None) -> TokenCounter:
    """One shared :class:`TokenCounter` per (model's encoding, encoding)."""
    return TokenCounter(encoding=encoding or encoding_for_model(model))


def count_tokens(text: str, *, model: str | None = None, encoding: str | None = None) -> int:
    """Tokens of ``text`` for ``model`` (or ``encoding``), counted locally.

    Example:
        >>> count_tokens("hello world", model="gpt-4o")        # doctest: +SKIP
        2
    """
    return counter_for(model, encoding).count(text)


def count_message_tokens(
    messages: Sequence[Any],
    *,
    model: str | None = None,
    encoding: str | None = None,
    tools: Sequence[Any] | None = None,
) -> int:
    """Prompt tokens of a chat request for ``model``: what ``usage.prompt_tokens`` will say.

    Example:
        >>> count_message_tokens([{"role": "user", "content": "hi"}], model="gpt-4o")   # doctest: +SKIP
        8
    """
    return counter_for(model, encoding).count_messages(messages, tools=tools)


__all__ = [
    "DEFAULT_ENCODING",
    "TokenCounter",
    "count_message_tokens",
    "count_tokens",
    "counter_for",
    "encoding_for_model",
]
