"""The driver's first pass over a dataset analysed without a report or the regime
(``reports.runs.analyses._fused``): where no clock moves, each partition is analysed in the
same task that surveys it, one pass instead of two; where the offsets over every partition
move a clock, every part is made again with them; either way the one-process answer.

A runner that maps the tasks here (as Dask would, one task per partition, results not
kept) counts the tasks, so the passes are seen."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from test_clocks import shifted  # noqa: E402
from test_part import SHIFT_NS, one_process, synthetic  # noqa: E402

from ttft.analysis.partition import partition_rows  # noqa: E402
from ttft.collectors import TraceLocation  # noqa: E402
from ttft.collectors.dataset_write import write_dataset  # noqa: E402
from ttft.reports.runs.analyses import InProcess, analyze_location  # noqa: E402


class Here(InProcess):
    """A dataset's partitions as a cluster maps them (``keeps`` False: each task reads its
    partition), run in this process, its tasks counted by name."""

    keeps = False

    def __init__(self) -> None:
        self.tasks: dict[str, int] = {}
        self.done = 0

    def pieces(self, location):
        return list(range(location.partitions()))

    def map(self, task, location, pieces, *args, each=None, on_done=None, sink=None):
        self.tasks[task.__name__] = self.tasks.get(task.__name__, 0) + len(pieces)
        return super().map(task, location, pieces, *args, each=each, on_done=on_done,
                           sink=sink)

    def tick(self) -> None:
        self.done += 1


def dataset(table, partitions: int, path: Path) -> TraceLocation:
    p = partition_rows(table, partitions)
    write_dataset(path, table, p.owner, p.copy_rows, p.copy_partitions, partitions, p.key)
    return TraceLocation(str(path))


def comparable(summary) -> dict:
    return {k: v for k, v in summary.to_dict().items() if k not in ("trace", "inputs")}


@pytest.mark.parametrize(("boundary", "policy"), [(None, "exclusive"), ("server", "shared")])
def test_one_host_is_analysed_in_one_pass(tmp_path, boundary, policy):
    run = Here()
    location = dataset(synthetic(), 5, tmp_path / "ds")
    found = analyze_location(location, run, boundary=boundary, policy=policy,
                             on_done=run.tick)
    want = one_process(synthetic(), boundary, policy)
    assert comparable(found.summary) == comparable(want.summary)
    assert run.tasks == {"_first_task": 5, "_part_task": 0}
    assert run.done == 2 * 5  # each partition's clocks and its analysis, in one task
    assert not any(c["applied"] for c in found.summary.to_dict().get("clocks", []))


@pytest.mark.parametrize("partitions", [2, 13])
def test_a_clock_the_whole_trace_moves_makes_every_part_again(tmp_path, partitions):
    """2 partitions of 40 requests each estimate the 3.7 s skew on their own (so their
    first task makes no part); 13 of about 6 are too few to (so each makes one, with its
    clocks unmoved, which the driver drops once the offsets over all 80 requests move the
    server clock)."""
    table = shifted(synthetic(80, 11), SHIFT_NS)
    run = Here()
    found = analyze_location(dataset(table, partitions, tmp_path / "ds"), run,
                             on_done=run.tick)
    want = one_process(table, None, "exclusive")
    assert comparable(found.summary) == comparable(want.summary)
    assert [c["applied"] for c in found.summary.to_dict()["clocks"]] == [True]
    assert run.tasks == {"_first_task": partitions, "_part_task": partitions}
    assert run.done == 2 * partitions
