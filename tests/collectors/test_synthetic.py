import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ttft.collectors.synthetic import (
    GENERATOR,
    SyntheticTrace,
    expected_path,
    generate,
    write_expected,
)
from ttft.tracer.schema import (
    BOUNDARY_NAMES,
    CLIENT_CLOCK,
    EV_FIRST_BYTE,
    EV_FIRST_SAMPLED,
    EV_FIRST_TOKEN,
    METADATA_KEY,
    POLICIES,
    SPAN_SCHEMA,
    STAGE_NAMES,
)


@pytest.fixture(scope="module")
def synth() -> SyntheticTrace:
    return generate(600, seed=3)


@pytest.fixture(scope="module")
def spans(synth: SyntheticTrace) -> pd.DataFrame:
    df = synth.table.to_pandas()
    for col in ("stage", "clock", "service"):
        df[col] = df[col].astype(str)
    return df


@pytest.fixture(scope="module")
def expected(synth: SyntheticTrace) -> pd.DataFrame:
    exp = synth.expected
    return exp.astype({c: str for c in ("trace_id", "request_id", "boundary", "policy", "stage")})


def attrs(df: pd.DataFrame, key: str) -> pd.Series:
    return df["attributes"].map(lambda s: json.loads(s)[key])


def first(df: pd.DataFrame, mask: pd.Series, col: str = "start_ns") -> pd.Series:
    return df[mask].groupby("trace_id")[col].min()


def test_table_has_the_span_schema(synth):
    assert synth.table.schema.equals(SPAN_SCHEMA)
    assert synth.table.schema.metadata is None
    assert synth.metadata["generator"] == GENERATOR
    assert (synth.metadata["requests"], synth.metadata["seed"]) == (600, 3)
    assert synth.metadata["rows"] == synth.table.num_rows


def test_deterministic_for_a_seed_and_different_for_another():
    a, b, c = generate(300, seed=7), generate(300, seed=7), generate(300, seed=8)
    assert a.table.equals(b.table)
    assert a.expected.equals(b.expected)
    assert not a.table.equals(c.table)
    assert set(a.table["trace_id"].to_pylist()).isdisjoint(c.table["trace_id"].to_pylist())


def test_expected_sums_to_every_window(spans, expected):
    ev, name, stage = spans["stage"] == "event", spans["name"], spans["stage"]
    engine_start = first(spans, stage == "tokenize")
    engine_start = engine_start.combine_first(first(spans, stage == "queue"))
    windows = {
        "client": first(spans, ev & (name == EV_FIRST_TOKEN)) - first(spans, stage == "client"),
        "server": first(spans, ev & (name == EV_FIRST_BYTE)) - first(spans, stage == "server"),
        "engine": first(spans, ev & (name == EV_FIRST_SAMPLED)) - engine_start,
    }
    want = {
        (trace, boundary, policy): int(length)
        for boundary, lengths in windows.items()
        for trace, length in lengths.items()
        for policy in POLICIES
    }
    sums = expected.groupby(["trace_id", "boundary", "policy"])["attributed_ns"].sum()
    assert {key: int(v) for key, v in sums.items()} == want
    assert len(want) == 600 * 3 * 3


def test_expected_rows_are_positive_and_named(expected, spans):
    assert list(expected.columns) == [
        "trace_id",
        "request_id",
        "boundary",
        "policy",
        "stage",
        "attributed_ns",
    ]
    assert (expected["attributed_ns"] > 0).all()
    assert set(expected["boundary"]) == set(BOUNDARY_NAMES)
    assert set(expected["policy"]) == set(POLICIES)
    assert set(expected["stage"]) <= set(STAGE_NAMES)
    client = spans[spans["stage"] == "client"].set_index("trace_id")["request_id"]
    pairs = expected.drop_duplicates("trace_id").set_index("trace_id")["request_id"]
    assert pairs.sort_index().equals(client.sort_index())
    assert not expected.duplicated(["trace_id", "boundary", "policy", "stage"]).any()


def test_derived_stages_appear_where_the_layout_puts_them(expected):
    stages = expected.groupby("boundary")["stage"].unique().map(set)
    assert {"network", "connect", "server", "prefill", "gpu", "sample"} <= stages["client"]
    assert "unattributed" in stages["engine"]
    assert not {"network", "server", "detokenize", "stream"} & stages["engine"]
    assert not {"network", "connect", "unattributed"} & stages["server"]


def test_the_gpu_tail_is_split_by_policy(expected):
    gpu = expected[expected["stage"] == "gpu"].pivot_table(
        index=["trace_id", "boundary"], columns="policy", values="attributed_ns"
    )
    tail = gpu["exclusive"] - gpu["critical-path"]
    assert (tail > 0).all()
    assert (gpu["shared"] - gpu["critical-path"]).equals((tail + 1) // 2)


def test_ids_are_unique_and_well_formed(spans):
    assert spans["span_id"].str.fullmatch(r"[0-9a-f]{16}").all()
    assert spans["trace_id"].str.fullmatch(r"[0-9a-f]{32}").all()
    assert spans["span_id"].is_unique
    parents = spans.dropna(subset=["parent_id"])
    known = set(zip(spans["trace_id"], spans["span_id"], strict=True))
    pairs = zip(parents["trace_id"], parents["parent_id"], strict=True)
    assert all(pair in known for pair in pairs)
    roots = spans[spans["parent_id"].isna()]
    assert set(roots["stage"]) == {"client", "step"}
    assert spans[spans["stage"] == "client"]["request_id"].str.fullmatch(r"cmpl-\d+").all()


def test_times_are_ordered(spans):
    assert (spans["end_ns"] >= spans["start_ns"]).all()
    events = spans[spans["stage"] == "event"]
    assert (events["end_ns"] == events["start_ns"]).all()
    client = spans[spans["clock"] == CLIENT_CLOCK]
    assert set(client["service"]) == {"loadgen"}
    by_name = events.groupby(["trace_id", "name"])["start_ns"].min().unstack()
    order = ["sent", EV_FIRST_SAMPLED, EV_FIRST_BYTE, EV_FIRST_TOKEN]
    assert (by_name[order].diff(axis=1).iloc[:, 1:] > 0).all().all()
    assert (by_name["first_chunk"] == by_name[EV_FIRST_TOKEN]).all()
    assert (events[events["name"] == "token"].groupby("trace_id").size() == 3).all()


def test_some_requests_hit_the_prefix_cache_and_some_are_cold(spans):
    chunks = spans[spans["stage"] == "prefill.chunk"]
    cached = attrs(chunks, "cached_tokens").groupby(chunks["trace_id"]).agg(["min", "max"])
    assert (cached["min"] == cached["max"]).all()
    assert 0 < (cached["max"] > 0).sum() < len(cached)
    server = spans[spans["stage"] == "server"].set_index("trace_id")
    assert attrs(server, "cached_tokens").sort_index().equals(cached["max"].sort_index())
    prompt = attrs(server, "prompt_tokens")
    tokens = attrs(chunks, "chunk_tokens").groupby(chunks["trace_id"]).sum()
    assert (prompt.sort_index() == (tokens + cached["max"]).sort_index()).all()


def test_chunks_have_gaps_and_gpu_outlasts_only_the_last(spans):
    chunks = spans[spans["stage"] == "prefill.chunk"].assign(step_id=lambda d: attrs(d, "step_id"))
    gpu = spans[spans["stage"] == "gpu"].assign(step_id=lambda d: attrs(d, "step_id"))
    assert gpu["step_id"].is_unique and set(gpu["clock"]) == {"gpu:0"}
    joined = chunks.merge(
        gpu[["step_id", "start_ns", "end_ns"]],
        on="step_id",
        suffixes=("", "_gpu"),
        validate="many_to_one",
    )
    assert len(joined) == len(chunks)
    joined = joined.sort_values(["trace_id", "start_ns"])
    last = ~joined["trace_id"].duplicated(keep="last")
    assert (joined["start_ns_gpu"] > joined["start_ns"]).all()
    assert (joined["start_ns_gpu"] < joined["end_ns"]).all()
    assert (joined.loc[last, "end_ns_gpu"] > joined.loc[last, "end_ns"]).all()
    assert (joined.loc[~last, "end_ns_gpu"] < joined.loc[~last, "end_ns"]).all()
    sample = spans[spans["stage"] == "sample"].set_index("trace_id")["end_ns"]
    tail = joined[last].set_index("trace_id")["end_ns_gpu"]
    assert (tail < sample.loc[tail.index]).all()
    counts = joined.groupby("trace_id").size()
    assert set(counts) == {1, 2, 3}
    gaps = joined["start_ns"].shift(-1) - joined["end_ns"]
    assert (gaps[~last] > 0).all()


def test_engine_steps_carry_batch_composition(spans):
    steps = spans[spans["stage"] == "step"]
    assert steps["request_id"].isna().all()
    ids = steps["attributes"].map(lambda s: json.loads(s)["request_ids"])
    assert ids.map(len).min() >= 1
    decode = steps[attrs(steps, "prefill_tokens") == 0]
    assert len(decode) > 0 and (attrs(decode, "decode_tokens") > 0).all()


def test_some_requests_start_the_engine_window_at_queue(spans):
    traces = set(spans.loc[spans["stage"] == "server", "trace_id"])
    tokenized = set(spans.loc[spans["stage"] == "tokenize", "trace_id"])
    assert 0 < len(traces - tokenized) < len(traces)


def test_expected_path():
    assert expected_path("demo.parquet") == Path("demo.expected.parquet")
    assert expected_path(Path("runs/demo")) == Path("runs/demo.expected.parquet")


def test_write_expected_round_trips(tmp_path, synth):
    path = write_expected(synth, tmp_path / "x.expected.parquet")
    assert path == tmp_path / "x.expected.parquet"
    back = pd.read_parquet(path)
    pd.testing.assert_frame_equal(back, synth.expected)
    meta = pq.read_schema(path).metadata[METADATA_KEY]
    assert json.loads(meta) == synth.metadata


def test_rejects_no_requests():
    with pytest.raises(ValueError, match="at least 1"):
        generate(0)


def test_a_100k_request_trace():
    synth = generate(100_000, seed=1)
    assert synth.table.num_rows > 1_000_000
    assert isinstance(synth.table["stage"].type, pa.DictionaryType)
    assert synth.table.column("trace_id").null_count == 0
