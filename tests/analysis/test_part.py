"""A dataset analysed partition by partition (``analysis.part``: each partition's
``analyze_part``, then one ``merge``) equals one process exactly: the merged summary,
clocks, failures, quality, boundaries and per-request parts, for every boundary and policy
and several partition counts, and the report's blame, prefill points and regime rows
(``ReportInputs``, merged into ``Analysis.report``); and ``partition_rows`` keeps every
request whole with the step traces it joins (issue 17)."""

from __future__ import annotations

import json
from functools import cache

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from _disagg import disaggregate
from hypothesis import given, settings
from hypothesis import strategies as st
from test_clocks import shifted

from ttft.analysis import analyze
from ttft.analysis.blame import blame, blame_summary
from ttft.analysis.clocks import offsets_from_bounds
from ttft.analysis.order_stats import Spilled
from ttft.analysis.part import (
    PartHeader,
    ReportInputs,
    analyze_part,
    assemble_table,
    default_boundary,
    global_steps,
    merge,
    merge_rows,
    own_rows,
    survey,
)
from ttft.analysis.part_figures import PartRows
from ttft.analysis.partition import partition_rows
from ttft.analysis.prefill import prefill_points
from ttft.analysis.regime import ModelShape, Peaks, RegimeSetup, find_peaks, regime
from ttft.analysis.result import Analysis
from ttft.collectors import read_spans
from ttft.collectors.dataset import read_partition
from ttft.collectors.dataset_write import write_dataset
from ttft.collectors.synthetic import generate
from ttft.tracer.schema import OWN_ROWS_KEY, POLICIES

TRACE = "dataset"
BOUNDARIES = (None, "client", "server", "engine")
PARTITIONS = (1, 2, 5, 13)
SHIFT_NS = 3_700_000_000
SOME = ((None, "exclusive"), ("server", "shared"), ("engine", "critical-path"))
"""A few (boundary, policy) pairs, for what the boundary and policy barely touch."""

Dataset = list[pa.Table]
"""Each partition as ``read_spans(path, partition=k)`` gives it: own rows, then borrowed,
the own count under ``OWN_ROWS_KEY`` in its schema metadata (``analysis.part.own_rows``)."""


def split(table: pa.Table, partitions: int) -> Dataset:
    """``table`` partitioned in memory, each partition's own rows first and their count in
    its metadata."""
    p = partition_rows(table, partitions)
    out = []
    for k in range(partitions):
        own = table.take(np.flatnonzero(p.owner == k))
        borrowed = table.take(p.copy_rows[p.copy_partitions == k])
        t = pa.concat_tables([own, borrowed])
        out.append(t.replace_schema_metadata(
            {**(t.schema.metadata or {}), OWN_ROWS_KEY: str(own.num_rows).encode()}))
    return out


def as_trace(table: pa.Table) -> pa.Table:
    """``table`` without ``OWN_ROWS_KEY``: every row its own, as the whole trace."""
    metadata = {k: v for k, v in (table.schema.metadata or {}).items() if k != OWN_ROWS_KEY}
    return table.replace_schema_metadata(metadata or None)


def owned(dataset: Dataset) -> pa.Table:
    """Every row the dataset holds once (the own rows, in partition order), as one trace."""
    return as_trace(pa.concat_tables([t.slice(0, own_rows(t)) for t in dataset]))


def in_partitions(dataset: Dataset, boundary, policy, offsets=None) -> Analysis:
    """The driver's protocol (``reports.runs.analyses``) without Dask: each partition's
    survey, the clock offsets over all of them, one part per partition, the dataset's
    default boundary (a part at another one analysed again), the merge."""
    surveys = [survey(t) for t in dataset]
    if offsets is None:
        offsets = offsets_from_bounds([s.bounds for s in surveys])
    parts = [analyze_part(t, offsets=offsets, boundary=boundary, policy=policy)
             for t in dataset]
    chosen = boundary or default_boundary(parts)
    parts = [part if part.attribution.boundary == chosen
             else analyze_part(t, offsets=offsets, boundary=chosen, policy=policy)
             for part, t in zip(parts, dataset, strict=True)]
    return merge(parts, offsets=offsets, metadata=surveys[0].metadata, trace=TRACE)


def one_process(table: pa.Table, boundary, policy) -> Analysis:
    return analyze(table, boundary=boundary, policy=policy, trace=TRACE)


@cache
def synthetic(requests: int = 300, seed: int = 7) -> pa.Table:
    return generate(requests, seed=seed).table


@cache
def synthetic_split(partitions: int) -> Dataset:
    return split(synthetic(), partitions)


@cache
def single_summary(boundary, policy) -> dict:
    return one_process(synthetic(), boundary, policy).summary.to_dict()


def sorted_rows(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(["trace_id", "stage"], kind="stable").reset_index(drop=True)


# --- the merged summary --------------------------------------------------------------------


@pytest.mark.parametrize("boundary", BOUNDARIES)
@pytest.mark.parametrize("partitions", PARTITIONS)
def test_merged_summary_equals_one_process_exactly(partitions, boundary):
    dataset = synthetic_split(partitions)
    assert owned(dataset).num_rows == synthetic().num_rows
    for policy in POLICIES:
        merged = in_partitions(dataset, boundary, policy)
        of_dataset = one_process(owned(dataset), boundary, policy)
        assert merged.summary.to_dict() == of_dataset.summary.to_dict(), (
            partitions, boundary, policy)
        assert merged.summary.to_dict() == single_summary(boundary, policy), (
            partitions, policy)
        assert merged.boundaries == of_dataset.boundaries
        assert merged.metadata == of_dataset.metadata
        assert merged.assembly is None and merged.report is None


@pytest.mark.parametrize("partitions", [2, 5, 13])
def test_a_disaggregated_datasets_kv_transfer_summary_merges_exactly(partitions):
    """Every request's K/V transfer lands in its request's partition; the merged summary,
    ``kv_transfer`` included, is the one-process summary."""
    table = disaggregate(synthetic())
    for boundary, policy in SOME:
        merged = in_partitions(split(table, partitions), boundary, policy).summary
        single = one_process(table, boundary, policy).summary.to_dict()
        assert merged.to_dict()["kv_transfer"]["requests"] == 300
        assert merged.to_dict() == single, (partitions, boundary, policy)


@pytest.mark.parametrize("partitions", [2, 13])
def test_merged_per_request_parts_equal_one_process(partitions):
    dataset = synthetic_split(partitions)
    for boundary in BOUNDARIES:
        for policy in POLICIES:
            merged = in_partitions(dataset, boundary, policy).attribution
            single = one_process(synthetic(), boundary, policy).attribution
            assert merged.boundary == single.boundary
            pd.testing.assert_frame_equal(sorted_rows(merged.per_request()),
                                          sorted_rows(single.per_request()))


def test_a_dataset_written_and_read_back_merges_to_the_same_summary(tmp_path):
    table = synthetic()
    p = partition_rows(table, 5)
    write_dataset(tmp_path / "ds", table, p.owner, p.copy_rows, p.copy_partitions, 5, p.key)
    dataset = [read_spans(tmp_path / "ds", partition=k) for k in range(5)]
    assert [own_rows(t) for t in dataset] == [
        read_partition(tmp_path / "ds", k)[1] for k in range(5)]
    assert sum(own_rows(t) for t in dataset) == table.num_rows
    assert sum(t.num_rows - own_rows(t) for t in dataset) == p.copy_rows.size > 0
    for boundary, policy in ((None, "exclusive"), ("server", "critical-path")):
        merged = in_partitions(dataset, boundary, policy).summary
        assert merged.to_dict() == single_summary(boundary, policy)


# --- a multi-host trace: the clock offset is global ---------------------------------------


@cache
def multi_host() -> pa.Table:
    return shifted(synthetic(80, 11), SHIFT_NS)


@pytest.mark.parametrize("boundary", BOUNDARIES)
@pytest.mark.parametrize("partitions", [2, 13])
def test_a_clock_offset_is_estimated_over_all_partitions(partitions, boundary):
    dataset = split(multi_host(), partitions)
    for policy in POLICIES:
        merged = in_partitions(dataset, boundary, policy).summary
        single = one_process(multi_host(), boundary, policy).summary.to_dict()
        assert merged.to_dict() == single, (partitions, boundary, policy)
        applied = [c for c in merged.to_dict()["clocks"] if c["applied"]]
        assert len(applied) == 1 and applied[0]["requests"] == 80
        assert abs(applied[0]["offset_ms"] * 1e6 + SHIFT_NS) < 1e6


def test_partitions_alone_could_not_estimate_the_offset():
    dataset = split(multi_host(), 13)
    global_offsets = offsets_from_bounds([survey(t).bounds for t in dataset])
    assert [c.applied for c in global_offsets] == [True]
    alone = [offsets_from_bounds([survey(t).bounds]) for t in dataset]
    assert any(not any(c.applied for c in offsets) for offsets in alone)
    # analysing each partition with its own offsets gives another answer
    parts = [analyze_part(t, offsets=offsets, boundary="client", policy="exclusive")
             for t, offsets in zip(dataset, alone, strict=True)]
    local = merge(parts, offsets=global_offsets, metadata=survey(dataset[0]).metadata,
                  trace=TRACE).summary
    single = one_process(multi_host(), "client", "exclusive").summary.to_dict()
    assert local.to_dict() != single


# --- failures and data quality ------------------------------------------------------------


def with_failures(table: pa.Table) -> pa.Table:
    """Every 4th request's client span fails (shed, disconnected or timed out): more
    failures of each kind than the examples kept, spread over the partitions."""
    frame = table.to_pandas()
    clients = np.flatnonzero(frame["stage"].to_numpy() == "client")
    kinds = [{"outcome": "shed", "status_code": 429, "error": "HTTP 429: busy"},
             {"outcome": "disconnected", "status_code": 200,
              "error": "ConnectionError: the server closed the connection"},
             {"status_code": None, "error": "timed out after 5 s"}]
    attributes = frame["attributes"].to_numpy(dtype=object).copy()
    for i, row in enumerate(clients[::4]):
        attributes[row] = json.dumps(kinds[i % 3])
    return table.set_column(table.schema.get_field_index("attributes"), "attributes",
                            pa.array(attributes, pa.string()))


@pytest.mark.parametrize("partitions", [2, 13])
def test_failures_spread_over_partitions_merge_to_one_process(partitions):
    table = with_failures(synthetic())
    dataset = split(table, partitions)
    owners = partition_rows(table, partitions).owner
    failed = table.column("attributes").to_numpy(zero_copy_only=False) != "{}"
    assert len(np.unique(owners[failed])) == partitions
    for boundary, policy in SOME:
        merged = in_partitions(dataset, boundary, policy).summary
        single = one_process(table, boundary, policy).summary.to_dict()
        m = merged.to_dict()
        assert sum(single["failures"].values()) == 75
        assert m["failures"] == single["failures"]
        assert m["failure_examples"] == single["failure_examples"]
        assert m["failed_first_token"] == single["failed_first_token"]
        assert m == single, (partitions, boundary, policy)


def defective_borrowed_rows(table: pa.Table, partitions: int) -> tuple[pa.Table, list[int]]:
    """``table`` with two rows of a step trace that is copied into other partitions made
    defective: a ``gpu`` span ending before it starts, a ``forward`` span without start."""
    p = partition_rows(table, partitions)
    copied = np.zeros(table.num_rows, bool)
    copied[p.copy_rows] = True
    stage = table.column("stage").to_numpy(zero_copy_only=False)
    gpu = int(np.flatnonzero(copied & (stage == "gpu"))[0])
    forward = int(np.flatnonzero(copied & (stage == "forward"))[-1])
    frame = table.to_pandas()
    frame.loc[gpu, "end_ns"] = frame.loc[gpu, "start_ns"] - 1_000
    starts = pa.array(frame["start_ns"].to_numpy(), pa.int64(),
                      mask=np.arange(len(frame)) == forward)
    out = pa.Table.from_pandas(frame, schema=table.schema, preserve_index=False)
    out = out.set_column(out.schema.get_field_index("start_ns"), "start_ns", starts)
    return out, [gpu, forward]


@pytest.mark.parametrize("partitions", [5, 13])
def test_a_defect_in_a_borrowed_row_is_counted_once(partitions):
    table, rows = defective_borrowed_rows(synthetic(), partitions)
    p = partition_rows(table, partitions)
    for row in rows:  # still copied somewhere after the damage
        assert row in set(p.copy_rows.tolist()), row
    dataset = split(table, partitions)
    for boundary, policy in SOME:
        analysis = in_partitions(dataset, boundary, policy)
        merged_attr, merged = analysis.attribution, analysis.summary
        single = one_process(table, boundary, policy)
        quality = single.summary.to_dict()["quality"]
        assert quality["end_before_start"] == 1 and quality["missing_field"] == 1
        assert merged.to_dict()["quality"] == quality, (partitions, boundary, policy)
        assert merged_attr.quality.counts == single.attribution.quality.counts
        assert merged.to_dict() == single.summary.to_dict()


def test_the_examples_of_a_defect_name_the_same_spans():
    """The examples the HTML report shows beside each defect are the one process's."""
    table, _ = defective_borrowed_rows(synthetic(), 5)
    merged = in_partitions(split(table, 5), None, "exclusive").attribution
    single = one_process(table, None, "exclusive").attribution
    assert merged.quality.examples == single.quality.examples


# --- partition_rows invariants ------------------------------------------------------------


def check_partitioning(table: pa.Table, partitions: int) -> None:
    p = partition_rows(table, partitions)
    frame = table.to_pandas()
    owner = p.owner
    assert owner.shape == (table.num_rows,)
    assert owner.min(initial=0) >= 0 and owner.max(initial=0) < partitions
    frame["owner"] = owner
    # every trace, and every request (traces sharing a request id), in one partition
    assert (frame.groupby("trace_id")["owner"].nunique() == 1).all()
    assert (frame.dropna(subset=["request_id"]).groupby("request_id")["owner"]
            .nunique() == 1).all()
    # a copy goes to another partition, once, and whole traces that hold no request
    pairs = set(zip(p.copy_rows.tolist(), p.copy_partitions.tolist(), strict=True))
    assert len(pairs) == p.copy_rows.size
    assert not (owner[p.copy_rows] == p.copy_partitions).any()
    traces = frame["trace_id"].to_numpy(dtype=object)
    request_traces = set(frame.dropna(subset=["request_id"])["trace_id"])
    assert not request_traces & set(traces[p.copy_rows])
    held: dict[int, set[int]] = {k: set(np.flatnonzero(owner == k)) for k in range(partitions)}
    for row, k in pairs:
        held[k].add(row)
    rows_of = frame.groupby("trace_id").indices
    for row, k in pairs:
        assert set(rows_of[traces[row]]) <= held[k]
    # every step trace a partition's chunks join is there, owned or borrowed
    steps = frame["attributes"].map(lambda a: json.loads(a).get("step_id"))
    gpu = frame[(frame["stage"] == "gpu") & steps.notna()]
    gpu_traces = {}
    for (service, step), trace in zip(zip(gpu["service"], steps[gpu.index], strict=True),
                                      gpu["trace_id"], strict=True):
        gpu_traces.setdefault((service, int(step)), set()).add(trace)
    chunks = frame[(frame["stage"] == "prefill.chunk") & steps.notna()]
    assert len(chunks) > 0
    joined = 0
    for i in chunks.index:
        for trace in gpu_traces.get((frame.at[i, "service"], int(steps[i])), ()):
            assert set(rows_of[trace]) <= held[int(owner[i])]
            joined += 1
    assert joined > 0


@pytest.mark.parametrize("partitions", PARTITIONS)
def test_partition_rows_keeps_requests_whole_and_their_steps_with_them(partitions):
    check_partitioning(synthetic(), partitions)


@settings(max_examples=20, deadline=None)
@given(requests=st.integers(1, 60), seed=st.integers(0, 1_000),
       partitions=st.integers(1, 17))
def test_partition_rows_invariants_hold_for_any_trace(requests, seed, partitions):
    check_partitioning(synthetic(requests, seed), partitions)


def test_every_row_of_a_dataset_is_owned_once_across_partitions():
    table = synthetic()
    dataset = synthetic_split(13)
    key = ["trace_id", "span_id", "name", "start_ns"]
    original = table.to_pandas().sort_values(key).reset_index(drop=True)
    back = owned(dataset).to_pandas().sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(original, back)


# --- what the report needs beyond the summary (``analysis.part.ReportInputs``) ----------

MODEL = {"n_layer": 4, "d_model": 512, "n_head": 8, "n_kv_head": 4, "d_ff": 1536,
         "vocab_size": 32000, "dtype": "bfloat16"}


def report_in_partitions(dataset: Dataset, shape=None, peaks=None):
    """The report's protocol (``reports.runs.analyses.report_location``) without Dask:
    surveys, global offsets and steps, one part with the report's rows per partition (at
    the dataset's default boundary), merged: ``(surveys, steps, merged Analysis)``."""
    surveys = [survey(t) for t in dataset]
    offsets = offsets_from_bounds([s.bounds for s in surveys])
    steps = global_steps(surveys, offsets)
    setup = None if shape is None else RegimeSetup(shape, peaks, None)
    report = ReportInputs(steps, setup)
    parts = [analyze_part(t, offsets=offsets, boundary=None, policy="exclusive",
                          report=report) for t in dataset]
    chosen = default_boundary(parts)
    parts = [part if part.attribution.boundary == chosen
             else analyze_part(t, offsets=offsets, boundary=chosen, policy="exclusive",
                               report=report)
             for part, t in zip(parts, dataset, strict=True)]
    merged = merge(parts, offsets=offsets, metadata=surveys[0].metadata, trace=TRACE,
                   regime=setup)
    return surveys, steps, merged


def by_request(frame: pd.DataFrame, *columns: str) -> pd.DataFrame:
    return frame.sort_values(["trace_id", *columns], kind="stable").reset_index(drop=True)


@pytest.mark.parametrize("partitions", [1, 2, 5, 13])
@pytest.mark.parametrize("trace", ["one host", "two hosts"])
def test_blame_and_prefill_points_of_partitions_equal_one_process(partitions, trace):
    table = synthetic() if trace == "one host" else multi_host()
    surveys, steps, merged = report_in_partitions(split(table, partitions))
    blamed, points, chunks = (merged.report.blame, merged.report.prefill_points,
                              merged.report.regime)
    one = analyze(table, policy="exclusive", trace=TRACE, regime={})
    asm = one.assembly
    assert steps.num_rows == len(asm.rows.of("step")) > 0
    assert len(surveys) == partitions and chunks is None
    single = blame(asm)
    assert len(single) > 0 and set(single["wait"]) >= {"queue", "between_chunks"}
    pd.testing.assert_frame_equal(by_request(blamed, "wait"), by_request(single, "wait"))
    pd.testing.assert_frame_equal(blame_summary(blamed), blame_summary(single))
    pd.testing.assert_frame_equal(by_request(points), by_request(prefill_points(asm)))
    # the one process's own report rows (``analyze(table, regime={})``) are the same
    pd.testing.assert_frame_equal(by_request(blamed, "wait"),
                                  by_request(one.report.blame, "wait"))
    pd.testing.assert_frame_equal(by_request(points), by_request(one.report.prefill_points))
    assert merged.summary.to_dict() == one.summary.to_dict()


def test_partitions_blamed_against_their_own_steps_alone_would_differ():
    dataset = split(synthetic(), 13)
    blamed = report_in_partitions(dataset)[2].report.blame
    alone = pd.concat([blame(assemble_table(t, offsets_from_bounds([survey(t).bounds])))
                       for t in dataset], ignore_index=True)
    assert not by_request(alone, "wait").equals(by_request(blamed, "wait"))


def test_the_step_table_is_moved_onto_the_client_clock():
    table = multi_host()
    surveys, steps, _ = report_in_partitions(split(table, 5))
    raw = pa.concat_tables([s.steps for s in surveys])
    moved = steps.column("start_ns").to_numpy() - raw.column("start_ns").to_numpy()
    offsets = offsets_from_bounds([s.bounds for s in surveys])
    assert set(moved.tolist()) == {offsets[0].offset_ns} and abs(moved[0] + SHIFT_NS) < 1e6


@pytest.mark.parametrize("partitions", [2, 13])
def test_regime_rows_of_partitions_equal_one_process(partitions):
    shape = ModelShape.from_dict(MODEL)
    peaks = find_peaks({"device": {"name": "H100 SXM"}})
    asm = one_process(synthetic(), None, "exclusive").assembly
    merged = report_in_partitions(split(synthetic(), partitions), shape, peaks)[2]
    chunks = merged.report.regime
    assert merged.regime == RegimeSetup(shape, peaks, None)
    single = regime(asm, shape, peaks)
    assert len(single) == len(asm.rows.of("prefill.chunk")) > 0
    order = ["context_before", "chunk_tokens", "dur_ns"]
    pd.testing.assert_frame_equal(by_request(chunks, *order), by_request(single, *order))
    assert chunks.attrs["peaks"] == peaks


def _untraced_gpu_trace() -> pa.Table:
    """Ten requests on server clock ``host:a`` (10 ms ahead of the client), each with a
    chunk whose gpu span lives in an engine trace of its own without a host-clock row,
    and one unrelated request of the same service on ``host:b``: the service has two host
    clocks in the table, one in most partitions."""
    from _build import event, row, table

    ahead = 10_000_000
    rows = []
    for i in range(10):
        t0, tr = i * 10_000_000, i + 1
        rows += [
            row(tr, 1, "client", t0, t0 + 1_000_000, clock="client", service="loadgen",
                request_id=f"r{i}"),
            event(tr, 2, "first_token", t0 + 850_000, parent=1, clock="client",
                  service="loadgen"),
            row(tr, 3, "server", t0 + 100_000 + ahead, t0 + 900_000 + ahead, parent=1,
                clock="host:a", request_id=f"r{i}"),
            row(tr, 4, "prefill.chunk", t0 + 200_000 + ahead, t0 + 600_000 + ahead, parent=3,
                clock="host:a", step_id=i),
            event(tr, 5, "first_byte", t0 + 800_000 + ahead, parent=3, clock="host:a"),
            row(100 + i, 1, "gpu", t0 + 250_000 + ahead, t0 + 650_000 + ahead, clock="gpu:0",
                step_id=i),
        ]
    t0 = 200_000_000
    rows += [
        row(50, 1, "client", t0, t0 + 1_000_000, clock="client", service="loadgen",
            request_id="other"),
        event(50, 2, "first_token", t0 + 850_000, parent=1, clock="client", service="loadgen"),
        row(50, 3, "server", t0 + 100_000, t0 + 900_000, parent=1, clock="host:b",
            request_id="other"),
        event(50, 5, "first_byte", t0 + 800_000, parent=3, clock="host:b"),
    ]
    return table(rows)


@pytest.mark.parametrize("partitions", (1, 2, 3, 5))
def test_a_gpu_span_without_a_host_clock_in_its_trace_moves_with_its_chunk(partitions):
    """Found: such a gpu span followed its service's one host clock in the table, which a
    partition without the ``host:b`` request showed and the whole table did not, so
    ``--workers`` moved gpu time the single process left alone. Its copy now moves with
    the chunk that joined it, in the whole table and in every partition alike."""
    whole = _untraced_gpu_trace()
    single = one_process(whole, "client", "exclusive")
    applied = [c for c in single.summary.to_dict()["clocks"] if c["applied"]]
    assert [c["server_clock"] for c in applied] == ["host:a"]
    gpu = single.attribution.attributed["gpu"].to_numpy()
    assert sorted(gpu.tolist()) == [0] + [400_000] * 10  # all of each chunk's gpu span
    merged = in_partitions(split(whole, partitions), "client", "exclusive").summary
    assert merged.to_dict() == single.summary.to_dict()


def test_a_waterfall_draws_a_moved_gpu_copy_where_attribution_has_it():
    """The waterfall draws the same gpu time attribution counts: a copy that moved with its
    chunk is drawn there (before: 10 ms off, at its gpu row's own times)."""
    from ttft.analysis._trees import CODE
    from ttft.analysis.assemble import assemble
    from ttft.reports.report_data import request_spans

    asm = assemble(_untraced_gpu_trace())
    spans = asm.spans
    drawn = 0
    for i in range(len(asm.requests)):
        frame = request_spans(asm, i, 0, 2**62)
        gpu = frame[frame["stage"] == "gpu"]
        copies = (spans.req == i) & (spans.stage == CODE["gpu"])
        assert sorted(zip(gpu["start_ns"], gpu["end_ns"], strict=True)) == sorted(
            zip(spans.start_ns[copies], spans.end_ns[copies], strict=True))
        drawn += len(gpu)
    assert drawn == 10


@pytest.mark.parametrize("partitions", [2, 5])
def test_spilled_parts_refined_pass_by_pass_give_the_one_process_summary(
        partitions, tmp_path, monkeypatch):
    """The driver of a dataset on Dask: each part spilled to disk, at most 3 values fetched
    around a rank per pass (every percentile refined by histograms), SLOs with a stage
    search; the same summary as one process, bit for bit, and no request stacked for it."""
    monkeypatch.setattr(Spilled, "fetch_limit", 3)
    dataset = synthetic_split(partitions)
    whole = one_process(synthetic(), None, "exclusive")
    slo = {"ttft": whole.summary.ttft_ms["p50"], "e2e": 10_000}
    whole = analyze(synthetic(), trace=TRACE, slo=slo)
    surveys = [survey(t) for t in dataset]
    offsets = offsets_from_bounds([s.bounds for s in surveys])
    parts = [analyze_part(t, offsets=offsets, boundary=whole.attribution.boundary)
             for t in dataset]
    for keep in (0, None):  # every pass read from disk; the parts kept once read
        rows = Spilled(str(tmp_path), save=PartRows.save, load=PartRows.load,
                       keep_bytes=keep)
        for k in reversed(range(partitions)):  # in any order, read back in part order
            rows.put(k, PartRows(parts[k].attribution, parts[k].values))
        merged = merge_rows(rows, [PartHeader.of(p) for p in parts], offsets=offsets,
                            metadata=surveys[0].metadata, trace=TRACE, slo=slo)
        assert merged.summary.goodput["ttft_stages"]["missing"] > 0
        assert merged.summary.to_dict() == whole.summary.to_dict()
        assert "requests" not in vars(merged.attribution)  # the summary stacked nothing
        pd.testing.assert_frame_equal(sorted_rows(merged.attribution.per_request()),
                                      sorted_rows(whole.attribution.per_request()))
        rows.close()
        assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("peaks", [find_peaks({"device": {"name": "H100 SXM"}}),
                                   Peaks(2e9, 5e8, "slow", "flags")])
def test_spilled_regime_rows_summarized_pass_by_pass_give_the_one_process_regime(
        peaks, tmp_path, monkeypatch):
    """``analyze DATASET --regime`` on Dask: each part's chunk rows spilled beside its
    requests, at most 2 values fetched around a median per pass; the regime's summary
    (counts, exact sums, medians) and its excess over the roofline (the slow device's
    chunks all beat it) are the one process's, whatever the partition count."""
    monkeypatch.setattr(Spilled, "fetch_limit", 2)
    shape = ModelShape.from_dict(MODEL)
    setup = RegimeSetup(shape, peaks, None)
    one = analyze(synthetic(), trace=TRACE, regime={"model_config": MODEL,
                                                     "peak_tflops": peaks.flops_per_s / 1e12,
                                                     "peak_bandwidth_gbs":
                                                         peaks.bytes_per_s / 1e9})
    want = one.regime_result
    assert want is not None and len(want.summary) > 4
    assert (want.excess is not None) == (peaks.device == "slow")
    for partitions in (3, 7):
        dataset = synthetic_split(partitions)
        surveys = [survey(t) for t in dataset]
        offsets = offsets_from_bounds([s.bounds for s in surveys])
        report = ReportInputs(None, setup, rows=False)
        parts = [analyze_part(t, offsets=offsets, boundary=one.attribution.boundary,
                              report=report) for t in dataset]
        rows = Spilled(str(tmp_path), save=PartRows.save, load=PartRows.load, keep_bytes=0)
        for k in reversed(range(partitions)):
            rows.put(k, PartRows(parts[k].attribution, parts[k].values,
                                 parts[k].report.regime))
        merged = merge_rows(rows, [PartHeader.of(p) for p in parts], offsets=offsets,
                            metadata=surveys[0].metadata, trace=TRACE, regime=setup)
        found = merged.regime_result
        assert found.frame is None and merged.report is None  # nothing gathered
        pd.testing.assert_frame_equal(found.summary, want.summary, check_exact=True)
        assert found.excess == want.excess and found.model_known
        rows.close()


def test_per_request_of_spilled_parts_one_without_conditions_writes_one_file(tmp_path):
    """A part whose requests have no condition types its column null; written part by
    part, the file still holds every part's rows (as one process writes them), and a
    failed request's status code comes back an int."""
    import json

    import pyarrow.parquet as pq

    from ttft.reports.cli.analyze import _write_per_request

    table = synthetic()
    first = split(table, 3)[0]
    mine = set(first.column("trace_id").to_pylist())
    attrs = []
    for tid, text in zip(table.column("trace_id").to_pylist(),
                         table.column("attributes").to_pylist(), strict=True):
        said = json.loads(text) if text else {}
        if tid in mine:
            said.pop("cached_tokens", None)
        attrs.append(json.dumps(said))
    table = table.set_column(table.schema.get_field_index("attributes"), "attributes",
                             pa.array(attrs, pa.string()))
    whole = analyze(table, trace=TRACE)
    dataset = split(table, 3)
    offsets = offsets_from_bounds([survey(t).bounds for t in dataset])
    parts = [analyze_part(t, offsets=offsets, boundary=whole.attribution.boundary)
             for t in dataset]
    assert parts[0].attribution.requests["condition"].isna().all()
    rows = Spilled(str(tmp_path), save=PartRows.save, load=PartRows.load)
    for k, part in enumerate(parts):
        rows.put(k, PartRows(part.attribution, part.values))
    merged = merge_rows(rows, [PartHeader.of(p) for p in parts], offsets=offsets)
    _write_per_request(merged.attribution, tmp_path / "parts.parquet")
    _write_per_request(whole.attribution, tmp_path / "whole.parquet")
    got, want = (pq.read_table(tmp_path / f"{n}.parquet").to_pandas()
                 for n in ("parts", "whole"))
    pd.testing.assert_frame_equal(sorted_rows(got), sorted_rows(want))
    codes = merged.attribution.failed["status_code"]
    assert codes.dtype == object and all(c is None or type(c) is int for c in codes)


def test_spilled_part_rows_come_back_frame_for_frame(tmp_path):
    """``PartRows.save``/``load``: every frame of the attribution and the values comes
    back equal; the stage matrices a pass reads come back from their ``.npy`` files,
    memory-mapped, and a plain attributed frame is not written twice (rebuilt from its
    matrix), while one with another index is kept as it was."""
    from dataclasses import replace

    from ttft.analysis.attribution import FRAMES

    part = analyze_part(synthetic())
    attr, values = part.attribution, part.values
    assert attr.covered is attr.raw  # one frame, saved once (as raw's matrix)
    odd = replace(attr, raw=attr.raw.set_axis(attr.raw.index + 7))
    for k, (mine, rebuilt) in enumerate([(attr, {"attributed", "raw", "covered"}),
                                         (odd, {"attributed"})]):
        directory = tmp_path / str(k)
        directory.mkdir()
        PartRows.save(PartRows(mine, values), str(directory))
        written = {p.stem for p in directory.glob("*.arrow")}
        assert not written & rebuilt and {"att", "raw", "ttft"} <= {
            p.stem for p in directory.glob("*.npy")}
        back = PartRows.load(str(directory))
        assert isinstance(back.att.base, np.memmap) or isinstance(back.att, np.memmap)
        np.testing.assert_array_equal(back.att, mine.attributed.to_numpy(np.int64))
        np.testing.assert_array_equal(back.ttft, mine.requests["ttft_ns"].to_numpy(np.int64))
        for name in FRAMES:
            pd.testing.assert_frame_equal(getattr(back.attribution, name), getattr(mine, name),
                                          check_exact=True)
        pd.testing.assert_frame_equal(back.values.transfers, values.transfers)
        assert (back.attribution.covered is back.attribution.raw) == (mine.covered is mine.raw)
