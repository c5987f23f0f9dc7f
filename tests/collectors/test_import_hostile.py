"""Hostile trace files: one clean `TraceFileError` (exit 2), bounded memory, streams read
once, rejections shown in data quality, non-finite attributes stored as valid JSON."""

import gzip
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ttft.analysis import analyze
from ttft.collectors import TraceFileError, read_spans, reader, run_metadata, write_trace
from ttft.collectors.rows import span_rows
from ttft.tracer.schema import METADATA_KEY, SCHEMA_VERSION, SPAN_SCHEMA

BIG = 2**64
TRACE = "ab" * 16
SPAN = "12" * 8
DEEP = 100_000


def _otlp(start: int, attributes: str = "[]") -> str:
    span = json.dumps({"traceId": TRACE, "spanId": SPAN, "name": "x",
                       "startTimeUnixNano": str(start), "endTimeUnixNano": str(start)})
    return ('{"resourceSpans":[{"scopeSpans":[{"spans":[' + span[:-1]
            + ',"attributes":' + attributes + "}]}]}]}")


def _jaeger(spans: str) -> str:
    return '{"data":[{"traceID":"' + TRACE + '","spans":' + spans + "}]}"


def _jaeger_span(start: object) -> str:
    return json.dumps([{"traceID": TRACE, "spanID": SPAN, "operationName": "x",
                        "startTime": start, "duration": 1}])


def _chrome_event(ts: object, args: str = "{}", head: str = "") -> str:
    return ('{' + head + '"traceEvents":[{"ph":"X","name":"a","ts":' + str(ts)
            + ',"dur":1,"pid":1,"tid":1,"args":' + args + "}]}")


NESTED = "[" * DEEP + "]" * DEEP

MALFORMED = {
    "chrome-int.json": _chrome_event(BIG),
    "chrome-float.json": _chrome_event("1e300"),
    "chrome-base.json": _chrome_event(1, head=f'"baseTimeNanoseconds":{BIG},'),
    "chrome-deep.json": _chrome_event(1, NESTED),
    "jaeger-int.json": _jaeger(_jaeger_span(BIG)),
    "jaeger-float.json": _jaeger(_jaeger_span(1e300)),
    "jaeger-deep.json": _jaeger(NESTED),
    "otlp-int.jsonl": _otlp(BIG) + "\n",
    "otlp-deep.jsonl": '{"resourceSpans":' + NESTED + "}\n",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_files_are_one_clean_error(tmp_path, name):
    path = tmp_path / name
    path.write_text(MALFORMED[name])
    with pytest.raises(TraceFileError) as error:
        read_spans(path)
    assert str(error.value).startswith(f"{path}: ")
    done = subprocess.run(["ttft", "analyze", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert "Traceback" not in done.stdout + done.stderr
    assert (done.stdout + done.stderr).strip().count("\n") == 0


def test_time_beyond_int64_in_otlp_is_a_rejected_span(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(_otlp(2**63 + 5) + "\n")
    table = read_spans(path)
    assert table.num_rows == 0
    assert run_metadata(table)["rejected"]["count"] == 1
    quality = analyze(table).summary.quality
    assert quality["rejected_span"] == 1


def test_rejected_spans_are_shown_by_analyze(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(_otlp(2**63 + 5) + "\n")
    text = subprocess.run(["ttft", "analyze", str(path)], capture_output=True, text=True,
                          timeout=120, check=True).stdout
    assert "1 rejected_span" in text
    out = subprocess.run(["ttft", "analyze", "--json", str(path)], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert json.loads(out)["quality"]["rejected_span"] == 1


# VmHWM, not ru_maxrss: the latter keeps the forking pytest process's peak across exec.
_HWM = """
def _hwm_mib():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) // 1024
"""

_PEAK = _HWM + """
import sys
from ttft.collectors import TraceFileError, read_spans
try:
    read_spans(sys.argv[1])
except TraceFileError as exc:
    print(exc.reason)
print(_hwm_mib())
"""


def _peak_mib(*argv: str, code: str = _PEAK) -> tuple[str, int]:
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                          text=True, timeout=300, check=True)
    *lines, peak = done.stdout.strip().splitlines()
    return "\n".join(lines), int(peak)


@pytest.mark.parametrize("name", ["bomb.json.gz", "bomb.jsonl.gz"])
def test_gzip_bomb_is_refused_in_bounded_memory(tmp_path, name):
    path = tmp_path / name
    prefix = b'{"traceEvents":[' if name.endswith(".json.gz") else b'{"resourceSpans":[],"x":"'
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(prefix)
        block = b" " * (1 << 20)
        for _ in range(1024):  # 1 GiB decompressed, about 1 MB compressed
            f.write(block)
    assert path.stat().st_size < 2 << 20
    reason, peak_mib = _peak_mib(str(path))
    assert reason == (f"decompresses to more than {256 << 20} bytes "
                      "(the limit MAX_DECOMPRESSED_BYTES)")
    assert peak_mib < 512


def test_many_copies_of_one_span_id_analyse_in_linear_memory(tmp_path):
    path = tmp_path / "dup.parquet"
    rows = span_rows("client", trace_id=TRACE, span_id="11" * 8, parent_id=None,
                     start_ns=1_000, end_ns=10**9, clock="client", service="c")
    for i in range(20_000):
        rows += span_rows("server", trace_id=TRACE, span_id=SPAN, parent_id="11" * 8,
                          start_ns=2_000 + i, end_ns=10**8 + i, clock="host:s", service="s")
    write_trace(path, rows)
    code = _HWM + ("import sys\nfrom ttft.analysis import analyze\n"
            "from ttft.collectors import read_spans\n"
            "print(analyze(read_spans(sys.argv[1])).summary.quality['duplicate_span_id'])\n"
            "print(_hwm_mib())\n")
    duplicates, peak_mib = _peak_mib(str(path), code=code)
    assert duplicates == "19999"
    assert peak_mib < 200


def test_non_finite_attributes_are_stored_as_valid_json(tmp_path):
    path = tmp_path / "nan.jsonl"
    attributes = ('[{"key":"a","value":{"doubleValue":"NaN"}},'
                  '{"key":"b","value":{"doubleValue":"-Infinity"}}]')
    path.write_text(_otlp(5, attributes) + "\n")
    text = read_spans(path).column("attributes").to_pylist()[0]
    assert json.loads(text, parse_constant=lambda c: pytest.fail(c)) == {
        "a": "NaN", "b": "-Infinity"}
    chrome = tmp_path / "nan.json"
    chrome.write_text(_chrome_event(1, '{"v":NaN}'))
    text = read_spans(chrome).column("attributes").to_pylist()[0]
    assert json.loads(text, parse_constant=lambda c: pytest.fail(c))["v"] == "NaN"


def test_standard_input_is_read_once(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(_otlp(2**63 + 5) + "\n" + _otlp(7) + "\n")
    code = ("import sys\nfrom ttft.collectors import read_spans, run_metadata\n"
            "t = read_spans('-')\nprint(t.num_rows, run_metadata(t)['source'])\n")
    with open(path, "rb") as stdin:
        done = subprocess.run([sys.executable, "-c", code], stdin=stdin, capture_output=True,
                              text=True, timeout=120, check=True)
    assert done.stdout.split() == ["1", "<stdin>"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
def test_fifo_is_read_once_and_never_hung_on(tmp_path, monkeypatch):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    payload = (_otlp(7) + "\n").encode()

    def write() -> None:
        with open(fifo, "wb") as f:
            f.write(payload)

    writer = threading.Thread(target=write)
    writer.start()
    table = read_spans(fifo)
    writer.join(10)
    assert table.num_rows == 1
    assert run_metadata(table)["source"] == str(fifo)
    monkeypatch.setattr(reader, "FIFO_WAIT_S", 0.2)
    with pytest.raises(TraceFileError) as error:
        read_spans(fifo)
    assert error.value.reason == "no writer opened the FIFO within 0.2 s"


def test_a_zstd_file_is_named_as_such(tmp_path):
    path = tmp_path / "t.json.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd" + b"\0" * 64)
    with pytest.raises(TraceFileError) as error:
        read_spans(path)
    assert error.value.reason == ("zstd-compressed, which ttft does not read; decompress it "
                                  "(zstd -d) or gzip it")


def test_gzip_jaeger_is_guessed_and_read(tmp_path):
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(_jaeger(_jaeger_span(5)).encode()))
    table = read_spans(path)
    assert run_metadata(table)["source_format"] == "jaeger"
    assert table.column("start_ns").to_pylist() == [5000]


def test_a_parquet_bomb_is_refused_in_bounded_memory(tmp_path):
    path = tmp_path / "bomb.parquet"
    n = 1_000_000
    indices = pa.array(np.zeros(n, np.int32))

    def same(value: object) -> pa.Array:
        return pa.DictionaryArray.from_arrays(indices, pa.array([value]))

    columns = {f.name: pa.array(np.ones(n, np.int64)) if f.name.endswith("_ns") else
               same('{"x":"' + "a" * 1000 + '"}' if f.name == "attributes" else "ab" * 16)
               for f in SPAN_SCHEMA}
    metadata = {METADATA_KEY: json.dumps({"schema_version": SCHEMA_VERSION}).encode()}
    pq.write_table(pa.table(columns).replace_schema_metadata(metadata), path,
                   compression="zstd")
    assert path.stat().st_size < 1 << 20  # about 1 GiB once decoded
    reason, peak_mib = _peak_mib(str(path))
    assert reason == (f"decodes to more than {256 << 20} bytes, over 100 times its size on "
                      "disk (the limits MAX_DECOMPRESSED_BYTES, MAX_PARQUET_RATIO)")
    assert peak_mib < 512
