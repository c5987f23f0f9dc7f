"""``PartitionPlan``: ``partition_rows``' rule over batches. Surveyed and routed batch by
batch, in any batch size and with traces spread over many batches, it gives every row the
owner ``partition_rows`` gives it over the whole table, the same copies and the same
request count, on traces with the cases that decide where a trace goes: hex ids in either
case, blank ids, several request ids in one trace, rows that are not valid."""

from __future__ import annotations

from functools import cache

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ttft.analysis import partition
from ttft.analysis._grouping import decode, group, step_keys
from ttft.analysis._trees import CODE
from ttft.analysis.partition import (
    Partitioning,
    PartitionPlan,
    _hash_mod,
    _rows_of,
    partition_rows,
)
from ttft.collectors.synthetic import generate
from ttft.tracer.schema import SPAN_SCHEMA


@cache
def base(requests: int, seed: int) -> pa.Table:
    return generate(requests, seed=seed).table


def awkward(table: pa.Table, seed: int) -> pa.Table:
    """``table`` with rows shuffled (a trace's rows spread over batches) and, in a few
    rows each: a trace id in upper case, a blank trace id, another request id, a span
    ending before it starts, a null request id."""
    rng = np.random.default_rng(seed)
    rows = table.to_pylist()
    n = len(rows)
    for i in rng.choice(n, size=max(1, n // 20), replace=False):
        kind = int(rng.integers(5))
        row = rows[i]
        if kind == 0:
            row["trace_id"] = row["trace_id"].upper()
        elif kind == 1:
            row["trace_id"] = ""
        elif kind == 2 and row["request_id"]:
            row["request_id"] = f"{row['request_id']}-also"
        elif kind == 3:
            row["end_ns"] = row["start_ns"] - 1
        else:
            row["request_id"] = None
    order = rng.permutation(n)
    return pa.Table.from_pylist([rows[i] for i in order], schema=SPAN_SCHEMA)


def planned(table: pa.Table, partitions: int, batch: int):
    plan = PartitionPlan(partitions)
    batches = [table.slice(i, batch) for i in range(0, table.num_rows, batch)] or [table]
    for b in batches:
        plan.survey(b)
    plan.finish()
    owner, copies, at = [], set(), 0
    count = 0
    for b in batches:
        routed = plan.route(b)
        owner.append(routed.owner)
        copies |= set(zip((routed.copy_rows + at).tolist(),
                          routed.copy_partitions.tolist(), strict=True))
        count += len(routed.copy_rows)
        at += b.num_rows
    assert count == len(copies)  # no copy twice
    return np.concatenate(owner), copies, plan.requests


def check(table: pa.Table, partitions: int, batch: int) -> None:
    whole = reference(table, partitions)
    owner, copies, requests = planned(table, partitions, batch)
    assert owner.tolist() == whole.owner.tolist()
    assert copies == set(zip(whole.copy_rows.tolist(), whole.copy_partitions.tolist(),
                             strict=True))
    assert requests == whole.requests


@pytest.mark.parametrize("batch", [10**9, 1_000, 37])
@pytest.mark.parametrize("partitions", [1, 3, 16])
def test_the_plan_routes_every_row_as_the_whole_table_does(partitions, batch):
    table = base(200, 5)
    check(table, partitions, batch)
    assert reference(table, partitions).copy_rows.size > 0 or partitions == 1
    whole = partition_rows(table, partitions)  # the plan over one batch
    assert whole.owner.tolist() == reference(table, partitions).owner.tolist()


@settings(max_examples=25, deadline=None)
@given(requests=st.integers(1, 40), seed=st.integers(0, 10_000),
       partitions=st.integers(1, 9), batch=st.integers(1, 400))
def test_the_plan_agrees_on_awkward_traces_in_any_batches(requests, seed, partitions, batch):
    check(awkward(base(requests, seed % 50), seed), partitions, batch)


@pytest.mark.parametrize("partitions", [1, 3])
def test_traces_sharing_a_first_hash_are_told_apart_by_the_second(monkeypatch, partitions):
    """With the first hash cut to a few values (each trace's partition kept: it is the
    first hash modulo the count), traces share it by the hundred and are still routed as
    the reference routes them."""
    hashes = partition._hashes

    def few(values):
        h1, h2 = hashes(values)
        return h1 % np.uint64(4 * partitions), h2

    monkeypatch.setattr(partition, "_hashes", few)
    check(awkward(base(60, 2), 2), partitions, 101)


def test_a_batch_the_survey_never_saw_is_refused():
    table = base(20, 1)
    plan = PartitionPlan(4)
    plan.survey(table.slice(0, 100))
    plan.finish()
    with pytest.raises(ValueError, match="input changed"):
        plan.route(table)


def test_partitions_must_be_positive():
    with pytest.raises(ValueError, match=">= 1"):
        PartitionPlan(0)


# --- the reference: the rule over a whole table, as it was written before the plan --------

def reference(table: pa.Table, partitions: int) -> Partitioning:
    """``partition_rows`` as it was before the plan: the whole table grouped as
    ``assemble`` groups it (``_grouping.group``), step keys joined by a pandas merge."""
    d = decode(table)
    g = group(table, d)
    trace_part = _hash_mod(np.asarray(d.trace_values, dtype=object), partitions)
    request_part = _hash_mod(g.names(d.trace_values), partitions)
    is_request = g.req_of_trace >= 0
    trace_part[is_request] = request_part[g.req_of_trace[is_request]]
    owner = np.where(d.trace >= 0, trace_part[np.maximum(d.trace, 0)], 0).astype(np.int32)
    span = np.flatnonzero((g.row_req >= 0) & (d.stage != CODE["event"])
                          & (d.stage != CODE["step"]))
    keys = step_keys(table, d.stage, g.row_req, d.valid, span)
    copy_traces = copy_parts = np.empty(0, np.int64)
    if keys is not None:
        need = pd.DataFrame({"service": keys.chunk_service, "step": keys.chunk_step,
                             "partition": request_part[g.row_req[keys.chunks]]})
        have = pd.DataFrame({"service": keys.gpu_service, "step": keys.gpu_step,
                             "trace": d.trace[keys.gpus]})
        pairs = have.merge(need, on=["service", "step"])[["trace", "partition"]]
        pairs = pairs.drop_duplicates()
        pairs = pairs[pairs["partition"].to_numpy() != trace_part[pairs["trace"].to_numpy()]]
        copy_traces = pairs["trace"].to_numpy(np.int64)
        copy_parts = pairs["partition"].to_numpy(np.int64)
    copy_rows, copy_partitions = _rows_of(d.trace, copy_traces, copy_parts)
    return Partitioning(owner, copy_rows, copy_partitions.astype(np.int32), g.n_req)
