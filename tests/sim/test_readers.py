"""Trace files: the four formats, what est / rate_cost / actual become, and bad rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from lane_plugin.errors import TraceError
from lane_plugin.sim.readers import load_trace, write_csv
from lane_plugin.sim.traffic import generate

TRACES = Path("/work/shared/traces")
AZURE = TRACES / "AzureLLMInferenceTrace_code.csv"
MOONCAKE = TRACES / "mooncake_conversation.csv"


def write(tmp_path, text: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_azure_format(tmp_path):
    path = write(
        tmp_path,
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:04.0319600,3180,8\n"
        "2023-11-16 18:17:03.9799600,4808,10\n"
        "2023-11-16 18:18:03.9799600,110,3000\n",
    )
    tr = load_trace(path, output_allowance=100, max_tokens=2_000)
    assert tr.arrival == [0.0, pytest.approx(0.052), 60.0]  # sorted, seconds from the first (UTC) stamp
    assert tr.input_tokens == [4808, 3180, 110]
    assert tr.output_tokens == [10, 8, 2_000]  # the provider stops at max_tokens
    assert tr.est == [4908, 3280, 210]  # input + the output allowance
    assert tr.rate_cost == [6808, 5180, 2110]  # input + max_tokens, what OpenAI's TPM counts
    assert tr.actual == [4818, 3188, 2110]
    assert tr.run_key == [None, None, None] and "Azure" in tr.source


def test_mooncake_format(tmp_path):
    path = write(tmp_path, "timestamp_ms,input_length,output_length\n1000,6758,500\n0,7322,490\n")
    tr = load_trace(path)
    assert tr.arrival == [0.0, 1.0]
    assert (tr.est, tr.rate_cost, tr.actual) == ([7322 + 256, 6758 + 256], [7322 + 2048, 6758 + 2048], [7812, 7258])


def test_tokens_format_with_runs_and_own_estimates(tmp_path):
    path = write(
        tmp_path,
        "arrival_s,input_tokens,output_tokens,stage,run_key,est\n0,100,50,draft,r1,\n2.5,300,20,review,r1,900\n",
    )
    tr = load_trace(path, output_allowance=64, max_tokens=512)
    assert (tr.stage, tr.run_key, tr.est) == (["draft", "review"], ["r1", "r1"], [164, 900])
    assert tr.rate_cost == [612, 812] and tr.actual == [150, 320]


def test_est_format_keeps_working_and_round_trips_new_columns(tmp_path):
    tr = generate(20, seed=3, days=0.01)
    path = tmp_path / "t.csv"
    write_csv(tr, path)
    assert path.read_text().splitlines()[0] == "arrival_s,stage,est,actual,run_key"  # nothing unknown written
    back = load_trace(path)
    assert (back.est, back.actual, back.run_key) == (tr.est, tr.actual, tr.run_key)
    calls = load_trace(write(tmp_path, "timestamp_ms,input_length,output_length\n0,10,5\n3,20,7\n", "m.csv"))
    write_csv(calls, path)
    again = load_trace(path)
    assert (again.rate_cost, again.input_tokens, again.output_tokens) == (calls.rate_cost, [10, 20], [5, 7])


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9,10,1\nyesterday,10,1\n",
            r"t\.csv, line 3: TIMESTAMP='yesterday' is not a date-time",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9,ten,1\n",
            r"line 2: ContextTokens='ten' is not a number",
        ),
        (
            "timestamp_ms,input_length,output_length\n0,10,1\n5,10,-3\n",
            r"line 3: output_length='-3' must be a finite number >= 0",
        ),
        ("timestamp_ms,input_length,output_length\n0,10.5,1\n", r"line 2: input_length='10.5' must be a whole number"),
        ("timestamp_ms,input_length,output_length\n0,0,1\n", r"line 2: input_length='0' gives est = input \+ 0"),
        ("arrival_s,input_tokens,output_tokens\n0,10,\n", r"line 2: output_tokens='' is not a number"),
        ("arrival_s,input_tokens,output_tokens\nnan,10,1\n", r"line 2: arrival_s='nan' must be a finite number"),
        ("arrival_s,stage,est,actual\n0,s,0,1\n", r"line 2: est='0' must be a finite number >= 1"),
        ("arrival_s,stage,est,actual,rate_cost\n0,s,5,1,x\n", r"line 2: rate_cost='x' is not a number"),
        ("arrival_s,stage,est\n0,s,1\n", r"missing column\(s\) actual of the 'est' trace format"),
        ("a,b\n1,2\n", r"unknown trace header \(have: a, b\)"),
        ("timestamp_ms,input_length,output_length\n", r"no jobs in the trace"),
    ],
)
def test_bad_rows_name_file_line_and_field(tmp_path, text, message):
    allowance = 0 if "0,0,1" in text else 256
    with pytest.raises(TraceError, match=message):
        load_trace(write(tmp_path, text), output_allowance=allowance)


def test_bad_options_and_missing_file(tmp_path):
    path = write(tmp_path, "timestamp_ms,input_length,output_length\n0,1,1\n")
    with pytest.raises(TraceError, match="max_tokens=0 must be > 0"):
        load_trace(path, max_tokens=0)
    with pytest.raises(TraceError, match="output_allowance=-1 must be >= 0"):
        load_trace(path, output_allowance=-1)
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "nope.csv")


@pytest.mark.skipif(not AZURE.exists(), reason=f"{AZURE} is not on this machine")
def test_the_shared_real_traces_load_whole():
    az = load_trace(AZURE)
    assert len(az) == 8_819 and sum(az.input_tokens) == 18_059_974 and sum(az.output_tokens) == 245_896
    assert 3_400 < az.span < 3_500  # about an hour
    mc = load_trace(MOONCAKE)
    assert len(mc) == 12_031 and sum(mc.input_tokens) == 144_793_823 and sum(mc.output_tokens) == 4_122_048


def test_a_spreadsheet_csv_with_a_byte_order_mark_reads(tmp_path):
    # Excel's "CSV UTF-8" starts with a BOM: it was "missing column(s) arrival_s ... (have: \ufeffarrival_s, ...)".
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbfarrival_s,stage,est,actual\n0,draft,100,120\n1,draft,200,220\n")
    assert load_trace(path).est == [100, 200]


@pytest.mark.parametrize("data", [b"arrival_s,stage,est,actual\n0,r\xe9sum\xe9,100,120\n", b"\x1f\x8b\x08\x00\xff\xfe"])
def test_a_file_that_is_not_utf8_names_the_file(tmp_path, data):
    # A Latin-1 or gzipped trace was "'utf-8' codec can't decode byte 0xe9 in position 30", naming no file.
    path = tmp_path / "latin.csv"
    path.write_bytes(data)
    with pytest.raises(TraceError, match=r"latin\.csv: not UTF-8 text"):
        load_trace(path)
