"""``ttft sweep``: one traced load step per load level, the same workload shape at each,
and one summary of where TTFT goes as load rises. No terminal here: the CLI
(``reports/cli/sweep.py``) shows the progress and the tables.

A sweep directory holds one trace per step (``step-01-rate-1.parquet``, named so that the
steps sort in order) and ``sweep.json`` (`SWEEP_FILE`), rewritten atomically (a temporary
file, then a rename) after every step and last of all, so it only ever names traces that
are on disk and an interrupted sweep keeps the steps it finished.

Each step is `ttft.collectors.trace_server` of the workload at that level, analysed as
``ttft analyze`` analyses its file (`ttft.analysis.analyze`, default boundary and policy;
with SLOs, goodput as ``ttft analyze --slo`` adds it). Steps run from the lowest level up,
each with fresh prompts (a seed derived from the sweep's base seed and the step's index,
`step_seed`) so the server's prefix cache does not carry one step's prompts into the next,
unless ``same_prompts``.

**The knee** (`knee_of`): a step *meets the SLO* when it ran, its goodput share (requests
meeting every SLO over ok plus failed requests, ``analysis.load``) is at least
``goodput_target``. The knee is the highest level L such that the step at L and every step
below it meet the SLO: the most load the server took before it first missed. Without SLOs
there is no knee; when the lowest step misses, neither.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ttft.analysis import analyze, percentile_bands
from ttft.collectors import read_spans
from ttft.collectors.trace_run import TraceSpec, server_models, server_root, trace_server
from ttft.collectors.writer import replace_bytes

__all__ = ["MODES", "SWEEP_FILE", "SweepSpec", "check_server", "knee_of", "parse_levels",
           "prepare_dir", "read_sweep", "run_sweep", "step_seed", "summarize_step"]

MODES = ("rate", "concurrency")
"""What a level sets: arrivals per second, or requests in flight (a closed loop)."""
SWEEP_FILE = "sweep.json"
KIND = "ttft sweep"
"""``sweep.json``'s ``kind``: what tells a sweep directory from any other."""
VERSION = 1
_STEP_NAME = re.compile(r"step-\d{2,}-(rate|concurrency)-[0-9.e+-]+\.parquet")

_NOT_MEASURED = dict.fromkeys(("sent", "cached_requests", "seconds", "boundary", "requests",
                               "failures", "ttft_ms", "throughput", "goodput", "stack"))
"""A step record's measured keys (see `summarize_step`): None until the step ran."""

StepDisplay = Callable[[int, float], AbstractContextManager[Mapping[str, Callable[..., None]]]]
"""``(step index, level)`` → a context manager around the step's run giving the keyword
callbacks ``trace_server`` takes (``on_start``, ``on_result``, ...)."""


@dataclass(frozen=True)
class SweepSpec:
    """A sweep: the workload of every step and the levels it runs at.

    Attributes:
        workload: the step's workload (``rate`` and ``concurrency`` unset: the level sets
            one); its ``seed`` is the sweep's base seed (None: a fresh one per sweep).
        mode: ``rate`` or ``concurrency``.
        levels: the load levels, in the order they run (lowest first).
        slo: a limit in ms per metric (``ttft``, ``tpot``, ``itl``, ``e2e``); None: no
            goodput and no knee.
        goodput_target: the goodput share a step needs to meet the SLO (0 < target <= 1).
        same_prompts: every step sends the same prompts (the base seed's).
    """

    workload: TraceSpec
    mode: str
    levels: tuple[float, ...]
    slo: Mapping[str, float] | None = None
    goodput_target: float = 0.9
    same_prompts: bool = False

    def check(self) -> None:
        """Raise ValueError naming the first setting that does not make sense."""
        if self.mode not in MODES:
            raise ValueError(f"the load mode must be one of {MODES}, not {self.mode!r}")
        if not self.levels:
            raise ValueError(f"give at least one --{self.mode} level")
        if not 0 < self.goodput_target <= 1:
            raise ValueError(f"--goodput-target must be in (0, 1], not {self.goodput_target}")
        if self.workload.rate or self.workload.concurrency or self.workload.burst \
                or self.workload.replay:
            raise ValueError("the sweep's levels set the arrivals: the workload sets none")
        self.step(0, 0).check()

    def step(self, index: int, base_seed: int) -> TraceSpec:
        """Step ``index``'s spec: the workload at ``levels[index]`` with its seed."""
        level = self.levels[index]
        arrivals = {"rate": level} if self.mode == "rate" else {"concurrency": int(level)}
        seed = base_seed if self.same_prompts else step_seed(base_seed, index)
        return replace(self.workload, seed=seed, **arrivals)

    def step_name(self, index: int) -> str:
        """The step's trace file name: ``step-01-rate-1.parquet`` (sorts in step order)."""
        return f"step-{index + 1:02d}-{self.mode}-{self.levels[index]:g}.parquet"


def step_seed(base_seed: int, index: int) -> int:
    """Step ``index``'s seed: drawn from ``base_seed`` and ``index`` (a 31-bit number), so
    steps get different prompts and the same ``base_seed`` repeats the whole sweep."""
    return random.Random(f"ttft-sweep:{base_seed}:{index}").getrandbits(31)


def parse_levels(text: str, mode: str) -> tuple[float, ...]:
    """``--rates``/``--concurrency``'s value, ``1,2,4,8``: positive numbers (whole ones for
    concurrency), sorted, each once.

    Raises:
        ValueError: naming the part that is not a positive (whole) number.
    """
    levels = set()
    for part in (p.strip() for p in text.split(",")):
        try:
            level = float(part)
        except ValueError:
            level = math.nan
        if not (level > 0 and math.isfinite(level)) or (mode == "concurrency"
                                                        and level != int(level)):
            kind = "a positive whole number" if mode == "concurrency" else "a positive number"
            option = "--rates" if mode == "rate" else "--concurrency"
            raise ValueError(f"{option} level {part!r}: expected {kind} (as in 1,2,4,8)")
        levels.add(level)
    return tuple(sorted(levels))


def read_sweep(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The sweep in directory ``path`` (``sweep.json``'s content); None when ``path`` is
    not a directory with a ``sweep.json``.

    Raises:
        ValueError: ``sweep.json`` exists but is not a sweep's (the message names it).
    """
    file = Path(path) / SWEEP_FILE
    if not file.is_file():
        return None
    try:
        found = json.loads(file.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{file}: not a readable sweep summary ({exc})") from None
    if not isinstance(found, dict) or found.get("kind") != KIND:
        raise ValueError(f"{file}: not a ttft sweep summary (no \"kind\": \"{KIND}\")")
    return found


def prepare_dir(path: str | os.PathLike[str]) -> None:
    """Make ``path`` ready for a sweep: create it, or take an empty directory, or an
    earlier sweep's (whose step traces are removed, so none is mixed with the new ones).

    Raises:
        ValueError: ``path`` is a file, or a non-empty directory that is not a sweep.
        OSError: it cannot be created.
    """
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        old = read_sweep(out)
        if old is None:
            raise ValueError(f"{out}: a non-empty directory that is not a sweep (no "
                             f"{SWEEP_FILE}); choose a new or empty directory")
        for step in old.get("steps", []):
            name = step.get("trace") if isinstance(step, dict) else None
            if isinstance(name, str) and _STEP_NAME.fullmatch(name):
                (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)


def check_server(url: str, api_key: str | None = None) -> None:
    """Raise ConnectionError when the server at ``url`` cannot be reached (a server that
    answers without a model list is fine here: the first step says what it lacks)."""
    with contextlib.suppress(LookupError):
        server_models(server_root(url), api_key)


def summarize_step(trace: str | os.PathLike[str],
                   slo: Mapping[str, float] | None = None) -> dict[str, Any]:
    """A step's figures from its trace, as ``ttft analyze --json [--slo]`` gives them:
    ``boundary``, ``requests`` (ok and failed), ``failures`` (``count``, ``rate``,
    ``by_kind``), ``ttft_ms`` (``p50``, ``p99``), ``throughput`` (``duration_s``,
    ``requests_per_s``, ``output_tokens_per_s``; None without client spans), ``goodput``
    (``share``, ``requests``, ``per_s``; None without ``slo``) and ``stack``: ms per stage
    of the requests near TTFT's p50 (``p50``, which sums to ``p50_ttft_ms``, see
    `ttft.analysis.percentile_bands`), each stage's ``mean`` ms and ``share`` of TTFT."""
    analysis = analyze(read_spans(trace), trace=str(trace), slo=slo)
    summary = analysis.summary
    failed = sum(summary.failures.values())
    load = summary.load
    good = summary.goodput
    bands = percentile_bands(analysis.attribution)
    p50 = bands.loc["p50"] if len(bands) else None
    return {
        "boundary": summary.boundary,
        "requests": summary.requests,
        "failures": {"count": failed,
                     "rate": failed / summary.requests if summary.requests else 0.0,
                     "by_kind": summary.failures},
        "ttft_ms": ({"p50": summary.ttft_ms["p50"], "p99": summary.ttft_ms["p99"]}
                    if summary.requests_ok else None),
        "throughput": None if load is None else {
            k: load[k] for k in ("duration_s", "requests_per_s", "output_tokens_per_s")},
        "goodput": None if good is None else {
            k: good[k] for k in ("share", "requests", "per_s")},
        "stack": {
            "p50": {} if p50 is None else {
                str(s): float(p50[s]) for s in bands.columns if s not in ("requests", "ttft_ms")},
            "p50_ttft_ms": None if p50 is None else float(p50["ttft_ms"]),
            "mean": {s: row["mean"] for s, row in summary.stages.items()},
            "share": {s: row["share"] for s, row in summary.stages.items()},
        },
    }


def knee_of(steps: list[dict[str, Any]], slo: Mapping[str, float] | None,
            goodput_target: float) -> dict[str, Any]:
    """The sweep's knee (see the module docstring) and each step's ``meets_slo`` (set on
    ``steps``): ``level`` (None where there is none) and ``reason``, one line."""
    if not slo:
        for step in steps:
            step["meets_slo"] = None
        return {"level": None, "reason": "no --slo given: no knee"}
    knee, missed = None, None
    for step in steps:
        good = step.get("goodput")
        step["meets_slo"] = bool(step["status"] == "ok" and good
                                 and good["share"] >= goodput_target)
        if missed is None and not step["meets_slo"]:
            missed = step
        elif missed is None:
            knee = step["level"]
    target = f"goodput >= {goodput_target:.0%}"
    if knee is None:
        why = ("failed" if missed and missed["status"] != "ok"
               else f"misses it ({_share(missed)} < {goodput_target:.0%})")
        return {"level": None,
                "reason": f"the lowest level already {why}: no knee within the sweep"}
    if missed is None:
        return {"level": knee, "reason": f"every level meets {target}: the knee is at or "
                                         "above the highest level swept"}
    return {"level": knee, "reason": f"the highest level meeting {target} before the first "
                                     f"that does not ({missed['level']:g}: {_share(missed)})"}


def _share(step: dict[str, Any] | None) -> str:
    good = (step or {}).get("goodput")
    return f"goodput {good['share']:.0%}" if good else "failed"


@dataclass
class _Sweep:
    """The summary being built: written after every step."""

    spec: SweepSpec
    out: Path
    base_seed: int
    steps: list[dict[str, Any]] = field(default_factory=list)
    stopped: str | None = None

    def content(self, finished: bool) -> dict[str, Any]:
        spec = self.spec
        workload = {k: v for k, v in asdict(spec.workload).items()
                    if k not in ("api_key", "receiver_token", "rate", "concurrency", "burst",
                                 "replay", "scale_tokens", "scale_time", "seed")}
        return {
            "kind": KIND, "version": VERSION, "url": server_root(spec.workload.url),
            "mode": spec.mode, "levels": list(spec.levels), "workload": workload,
            "base_seed": self.base_seed, "same_prompts": spec.same_prompts,
            "slo": dict(spec.slo) if spec.slo else None,
            "goodput_target": spec.goodput_target, "finished": finished,
            "stopped": self.stopped, "steps": self.steps,
            "knee": knee_of(self.steps, spec.slo, spec.goodput_target),
        }

    def write(self, finished: bool) -> dict[str, Any]:
        content = self.content(finished)
        # Durable before the next step starts: a crash keeps every finished step's summary.
        replace_bytes(self.out / SWEEP_FILE, (json.dumps(content, indent=2) + "\n").encode())
        return content


def run_sweep(spec: SweepSpec, out: str | os.PathLike[str], *,
              step_display: StepDisplay | None = None,
              on_step: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run every step of ``spec`` into directory ``out`` (see the module docstring) and
    return ``sweep.json``'s content.

    A step whose run raises (the server went away: ``ConnectionError``; a receiver or file
    error: ``OSError``) is recorded with ``status`` ``failed`` and its ``error``, and the
    sweep stops there (``stopped`` says why); every earlier step stays recorded. Ctrl-C
    records the step as ``interrupted``, writes ``sweep.json`` and re-raises.

    Args:
        step_display: wraps each step's run and gives it ``trace_server``'s callbacks.
        on_step: called with each step's record once it is written.

    Raises:
        ValueError: a bad setting or ``out`` is not a sweep's directory (before any step).
        ConnectionError: the server is unreachable (before any step).
        OSError: ``out`` cannot be created or ``sweep.json`` written.
    """
    spec.check()
    base_seed = spec.workload.seeded().seed
    assert base_seed is not None
    check_server(spec.workload.url, spec.workload.api_key)
    prepare_dir(out)
    sweep = _Sweep(spec, Path(out), base_seed)
    display = step_display or (lambda index, level: contextlib.nullcontext({}))
    for index, level in enumerate(spec.levels):
        step_spec = spec.step(index, base_seed)
        trace = sweep.out / spec.step_name(index)
        record: dict[str, Any] = {"index": index + 1, "level": level, "trace": trace.name,
                                  "seed": step_spec.seed, "status": "ok", "error": None,
                                  **_NOT_MEASURED}
        sweep.steps.append(record)
        try:
            with display(index, level) as callbacks:
                run = trace_server(step_spec, trace, **callbacks)
        except KeyboardInterrupt:
            record.update(status="interrupted", error="interrupted (Ctrl-C or SIGTERM)")
            sweep.stopped = f"interrupted at step {index + 1}"
            sweep.write(finished=False)
            raise
        except (ConnectionError, OSError, ValueError) as exc:
            record.update(status="failed", error=str(exc))
            if not trace.exists():
                record["trace"] = None
            sweep.stopped = f"step {index + 1} ({spec.mode} {level:g}) failed: {exc}"
        else:
            record.update(sent=len(run.results), cached_requests=run.cached,
                          seconds=run.seconds, **summarize_step(trace, spec.slo))
        sweep.write(finished=False)
        if on_step is not None:
            on_step(record)
        if sweep.stopped:
            break
    return sweep.write(finished=True)
