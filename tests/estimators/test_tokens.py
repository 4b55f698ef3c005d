"""Exact input tokens offline: bpe-openai's shipped vocabularies, a cached tiktoken, chars/4 with one warning.

The chat counts are the OpenAI cookbook's ("How to count tokens with tiktoken"),
which match what the API reported as ``usage.prompt_tokens`` for its sample
conversation: 129 on gpt-3.5-turbo / gpt-4 (cl100k_base), 124 on gpt-4o /
gpt-4o-mini (o200k_base); with its weather tool, 105 and 101.
"""

from __future__ import annotations

import doctest
import gzip
import hashlib
import importlib.resources
import itertools
import logging
import subprocess
import sys

import pytest

from lane_plugin.errors import InvalidInput, TiktokenUnavailable
from lane_plugin.estimators import tokens as T
from lane_plugin.estimators.tokens import TokenCounter, count_message_tokens, encoding_for_model

COOKBOOK_MESSAGES = [
    {
        "role": "system",
        "content": "You are a helpful, pattern-following assistant that translates corporate jargon "
        "into plain English.",
    },
    {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
    {"role": "system", "name": "example_assistant", "content": "Things working well together will increase revenue."},
    {
        "role": "system",
        "name": "example_user",
        "content": "Let's circle back when we have more bandwidth to touch base "
        "on opportunities for increased leverage.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Let's talk later when we're less busy about how to do better.",
    },
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean for the client deliverable.",
    },
]
WEATHER_TOOL = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "description": "Get the current weather in a given location",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                    "unit": {
                        "type": "string",
                        "description": "The unit of temperature to return",
                        "enum": ["celsius", "fahrenheit"],
                    },
                },
                "required": ["location"],
            },
        },
    }
]
WEATHER_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant that can answer to questions about the weather."},
    {"role": "user", "content": "What's the weather like in San Francisco?"},
]


@pytest.mark.parametrize(
    "model, encoding",
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini-2024-07-18", "o200k_base"),
        ("o1-preview", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("gpt-4.1-nano", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("openai/gpt-4o", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-0613", "cl100k_base"),
        ("gpt-4-turbo", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("azure/gpt-35-turbo", "cl100k_base"),
        ("cl100k_base", "cl100k_base"),
        ("claude-sonnet-4-5", T.DEFAULT_ENCODING),
        ("llama-3", T.DEFAULT_ENCODING),
        (None, T.DEFAULT_ENCODING),
    ],
)
def test_the_encoding_follows_the_model_name(model, encoding):
    assert encoding_for_model(model) == encoding


def test_bpe_openai_is_the_default_backend_here():
    counter = TokenCounter("gpt-4o")
    assert (counter.backend, counter.label, counter.encoding) == ("bpe-openai", "o200k_base", "o200k_base")


@pytest.mark.parametrize(
    "model, expected",
    [("gpt-3.5-turbo", 129), ("gpt-4-0613", 129), ("gpt-4", 129), ("gpt-4o", 124), ("gpt-4o-mini", 124)],
)
def test_chat_messages_count_as_the_openai_api_counted_them(model, expected):
    assert count_message_tokens(COOKBOOK_MESSAGES, model=model) == expected


@pytest.mark.parametrize(
    "model, expected", [("gpt-3.5-turbo", 105), ("gpt-4", 105), ("gpt-4o", 101), ("gpt-4o-mini", 101)]
)
def test_tools_count_as_the_openai_api_counted_them(model, expected):
    assert count_message_tokens(WEATHER_MESSAGES, model=model, tools=WEATHER_TOOL) == expected


def test_the_sdks_own_message_types_and_content_parts_count_like_dicts():
    from openai.types.chat import ChatCompletionMessage

    counter = TokenCounter("gpt-4o")
    reply = ChatCompletionMessage(role="assistant", content="Things working well together will increase revenue.")
    as_dicts = [
        {"role": "user", "content": "New synergies will help drive top-line growth."},
        {"role": "assistant", "content": reply.content},
    ]
    mixed = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "New synergies will help drive top-line growth."},
                {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
            ],
        },
        reply,
    ]
    assert counter.count_messages(mixed) == counter.count_messages(as_dicts)
    assert counter.count_prompt({"messages": as_dicts}) == counter.count_messages(as_dicts)


def test_long_texts_are_counted_in_pieces_that_add_up_to_the_whole():
    import bpe_openai

    enc = bpe_openai.get_encoding("o200k_base")
    text = " ".join(f"line {i}: the quick brown fox, naïve café, 日本語, x={i * 7.5}\n" for i in range(3000))
    assert len(text) > 3 * T._PIECE
    assert TokenCounter(encoding="o200k_base").count(text) == len(enc.encode(text, disallowed_special=()))
    assert TokenCounter(encoding="o200k_base").count("A" * 1_500_000) > 0  # no whitespace, over bpe-openai's limit


def _seed_tiktoken_cache(directory) -> None:
    """tiktoken's cache (files named by the SHA-1 of the vocabulary's URL), filled from the vocabularies
    bpe-openai ships: the same bytes, which tiktoken checks against its expected hash."""
    for name in ("cl100k_base", "o200k_base"):
        data = gzip.decompress(
            importlib.resources.files("bpe_openai.data").joinpath(f"{name}.tiktoken.gz").read_bytes()
        )
        url = f"https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
        (directory / hashlib.sha1(url.encode()).hexdigest()).write_bytes(data)


def test_a_cached_tiktoken_counts_the_same_as_bpe_openai(tmp_path, monkeypatch):
    pytest.importorskip("tiktoken")
    _seed_tiktoken_cache(tmp_path)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    texts = ["hello world", "def f(x):\n    return x ** 2  # ünïcödé", "日本語のテキスト", "<|endoftext|> is text here"]
    for encoding in ("cl100k_base", "o200k_base"):
        tk, bpe = TokenCounter(encoding=encoding, backend="tiktoken"), TokenCounter(encoding=encoding)
        assert tk.backend == "tiktoken" and bpe.backend == "bpe-openai"
        assert [tk.count(t) for t in texts] == [bpe.count(t) for t in texts]
        assert tk.count_messages(COOKBOOK_MESSAGES) == bpe.count_messages(COOKBOOK_MESSAGES)


def test_tiktoken_without_its_cached_file_is_refused_not_downloaded(tmp_path, monkeypatch):
    pytest.importorskip("tiktoken")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    with pytest.raises(TiktokenUnavailable, match="cache"):
        TokenCounter(encoding="o200k_base", backend="tiktoken")


def test_without_a_tokenizer_it_counts_chars_over_4_and_warns_once(monkeypatch, caplog):
    monkeypatch.setattr(T, "_bpe_openai", lambda encoding: None)
    monkeypatch.setattr(T, "_tiktoken", lambda encoding: None)
    monkeypatch.setattr(T, "_warn_turns", itertools.count())
    with caplog.at_level(logging.WARNING, logger="lane_plugin.estimators"):
        a, b = TokenCounter("gpt-4o"), TokenCounter("gpt-4")
    assert (a.backend, a.label, a.count("x" * 41)) == ("chars/4", "chars4", 11)
    assert b.backend == "chars/4"
    warnings = [r for r in caplog.records if "characters / 4" in r.getMessage()]
    assert len(warnings) == 1 and "lane-plugin[tokens]" in warnings[0].getMessage()


def test_the_fallback_warning_is_logged_once_per_process():
    code = (
        "import logging, sys\n"
        "sys.modules['bpe_openai'] = None; sys.modules['tiktoken'] = None\n"
        "logging.basicConfig(level=logging.WARNING, stream=sys.stdout)\n"
        "from lane_plugin.estimators.tokens import TokenCounter\n"
        "print([TokenCounter(m).backend for m in ('gpt-4o', 'gpt-4', 'o3')])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "['chars/4', 'chars/4', 'chars/4']" in out
    assert out.count("characters / 4") == 1


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda: TokenCounter(encoding="p50k_base"), "encoding"),
        (lambda: TokenCounter(backend="sentencepiece"), "backend"),
        (lambda: encoding_for_model(""), "model"),
        (lambda: TokenCounter().count_messages("hello"), "messages"),
        (lambda: TokenCounter().count_messages([{"content": "no role"}]), r"messages\[0\]"),
        (lambda: TokenCounter().count_prompt(42.5), "prompt"),
        (lambda: TokenCounter().count_tools([{"type": "function"}]), r"tools\[0\]"),
    ],
)
def test_bad_input_names_the_field(call, field):
    with pytest.raises(InvalidInput, match=field):
        call()


def test_the_module_examples_hold():
    import importlib

    for module in (T, importlib.import_module("lane_plugin.estimators.learned")):
        failures, _ = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert failures == 0, module.__name__
