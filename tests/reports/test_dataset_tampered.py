"""A dataset changed after it was written gives one clear error, the same in one process and
with ``--workers``, never a silent wrong answer (issue 37): a partition count edited down
or up, a borrowed file deleted, a partition replaced by a copy of another."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ttft.collectors import DATASET_FILE
from ttft.reports.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tamper")
    trace, dataset = root / "t.parquet", root / "ds"
    for args in (["synth", "-o", str(trace), "--requests", "200", "--seed", "4"],
                 ["partition", str(trace), "-o", str(dataset), "--partitions", "4"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    return dataset


def edit_info(dataset: Path, **changes) -> None:
    info = json.loads((dataset / DATASET_FILE).read_text())
    (dataset / DATASET_FILE).write_text(json.dumps({**info, **changes}))


def with_borrowed(dataset: Path) -> Path:
    return next(p for p in sorted(dataset.glob("part=*/borrowed.parquet")))


TAMPER = {
    "fewer partitions": (lambda ds: edit_info(ds, partitions=2),
                         "holds part=2 beyond the 2 partitions"),
    "a billion partitions": (lambda ds: edit_info(ds, partitions=10**9),
                             "lacks part=4, part=5, part=6 of the 1000000000 partitions"),
    "a borrowed file deleted": (lambda ds: with_borrowed(ds).unlink(),
                                "copies, its _ttft_dataset.json says"),
    "a partition copied over another": (
        lambda ds: shutil.copy(ds / "part=0" / "spans.parquet", ds / "part=1" / "spans.parquet"),
        "belongs to partition 0 of dataset"),
}


@pytest.mark.parametrize("change", sorted(TAMPER))
def test_a_changed_dataset_is_one_error_in_one_process(written, tmp_path, change):
    dataset = tmp_path / "ds"
    shutil.copytree(written, dataset)
    assert runner.invoke(app, ["analyze", str(dataset)]).exit_code == 0  # whole, it reads
    tamper, message = TAMPER[change]
    tamper(dataset)
    result = runner.invoke(app, ["analyze", str(dataset)])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert message in result.stderr, result.stderr
    assert "changed after it was written" in result.stderr or "belongs to" in result.stderr


@pytest.mark.parametrize("change", ["a borrowed file deleted", "a partition copied over another"])
def test_workers_give_the_same_error(written, tmp_path, change):
    pytest.importorskip("distributed")
    dataset = tmp_path / "ds"
    shutil.copytree(written, dataset)
    TAMPER[change][0](dataset)
    one = runner.invoke(app, ["analyze", str(dataset)])
    result = subprocess.run([sys.executable, "-m", "ttft.reports.cli", "analyze", str(dataset),
                             "--workers", "2"], capture_output=True, text=True, timeout=120)
    assert (result.returncode, one.exit_code) == (2, 2)
    assert result.stderr == one.stderr and result.stdout == ""
