"""``ttft validate``: does attribution recover delays injected at known stages?

Runs the reference engine twice, one phase after the other, on the same seeded prompts
at concurrency 1: first as it is (``baseline``), then with ``inject_delay_ms``
(``injected``). Each phase has its own engine, in-process server, tracing and trace file.
Both traces are attributed at the ``server`` boundary with the ``exclusive`` policy, and
for every delayed stage the median attributed time of the injected phase minus that of
the baseline (``recovered``) must equal the injected delay within
``max(1 ms, 5 % of the delay)``.

Every delay the engine accepts sleeps inside the span of its own stage (``tokenize`` and
``detokenize`` on the request's asyncio path, ``queue`` by holding the request back from
admission, ``schedule`` and ``sample`` in the worker), and every one of those spans lies
before the first token leaves the server, so the server-boundary TTFT median should rise
by about the sum of the delays: that is reported beside the stages, for information.

With ``disaggregate`` both phases serve a ``DisaggEngine`` (a prefill worker process, the
decode worker in this process, the first token delivered from the decode side, so TTFT
includes the transfer), whose worker's spans join the phase's trace; ``kv_transfer`` can
then be delayed too (``DISAGG_DEFAULT_DELAYS_MS``), and is refused otherwise.

With ``preemption`` a third run follows: a K/V pool too small for its requests, recompute
preemption on, and the ``preempted`` stage checked in TTFT and in blame
(``ttft.reports.runs.validate_preemption``; not with ``disaggregate``, whose engine does
not preempt).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import numpy as np

from ttft.analysis.pipeline import analyze
from ttft.collectors import TraceWriter, loadgen, read_spans, workloads
from ttft.collectors.otel_exporter import ParquetSpanExporter
from ttft.engine.faults import DELAY_STAGES as ENGINE_DELAY_STAGES
from ttft.reports.runs.validate_preemption import PreemptionCheck, run_preemption_case
from ttft.tracer import configure
from ttft.tracer.schema import OUTCOME_OK

__all__ = [
    "DEFAULT_DELAYS_MS",
    "DISAGG_DEFAULT_DELAYS_MS",
    "DELAY_STAGES",
    "PhaseRun",
    "StageCheck",
    "ValidateResult",
    "check_delays",
    "run_validate",
    "tolerance_ms",
]

DELAY_STAGES = ENGINE_DELAY_STAGES
"""The stages the reference engine can delay (``EngineConfig.inject_delay_ms``); each
delay lands inside the span of the stage of the same name."""

DEFAULT_DELAYS_MS: Mapping[str, float] = MappingProxyType(
    {"tokenize": 20.0, "queue": 30.0, "sample": 10.0, "detokenize": 5.0}
)

DISAGG_DEFAULT_DELAYS_MS: Mapping[str, float] = MappingProxyType(
    {**DEFAULT_DELAYS_MS, "kv_transfer": 15.0}
)
"""The defaults of ``ttft validate --disaggregate``: the transfer delayed too."""
DISAGG_ONLY = ("kv_transfer",)
"""Stages only a disaggregated engine has."""

BOUNDARY = "server"
POLICY = "exclusive"
_PROMPT_TOKENS = 64
_MAX_TOKENS = 4
_WARMUP = 3
_TIMEOUT_S = 60.0


def tolerance_ms(injected_ms: float) -> float:
    """How far a recovered delay may be from the injected one: max(1 ms, 5 %)."""
    return max(1.0, 0.05 * injected_ms)


def check_delays(
    delays_ms: Mapping[str, float], *, disaggregate: bool = False
) -> dict[str, float]:
    """``delays_ms`` as a plain dict of floats.

    Raises:
        ValueError: a stage the engine cannot delay (``kv_transfer`` without
            ``disaggregate``), or a negative delay.
    """
    if not disaggregate and set(delays_ms) & set(DISAGG_ONLY):
        raise ValueError("kv_transfer has a delay only in a disaggregated engine: "
                         "add --disaggregate")
    stages = [s for s in DELAY_STAGES if disaggregate or s not in DISAGG_ONLY]
    bad = sorted(set(delays_ms) - set(stages))
    if bad:
        raise ValueError(
            f"cannot inject a delay into {', '.join(map(repr, bad))}; "
            f"choose from {', '.join(stages)}"
        )
    negative = {s: ms for s, ms in delays_ms.items() if not ms >= 0}
    if negative:
        raise ValueError(f"delays must be >= 0 ms, got {negative}")
    return {s: float(ms) for s, ms in delays_ms.items()}


@dataclass(frozen=True)
class StageCheck:
    """One stage: medians (ms) of both phases against the delay injected into it.

    Attributes:
        stage: the stage name (``ttft`` for the informational TTFT row).
        baseline_median_ms: median attributed time without delays.
        injected_median_ms: median attributed time with the delays.
        injected_ms: the delay injected into the stage (for ``ttft``: the sum of all).
        tolerance_ms: ``max(1 ms, 5 % of injected_ms)``.
    """

    stage: str
    baseline_median_ms: float
    injected_median_ms: float
    injected_ms: float
    tolerance_ms: float

    @property
    def recovered_ms(self) -> float:
        """How much the median rose: what attribution says the delay was."""
        return self.injected_median_ms - self.baseline_median_ms

    @property
    def error_ms(self) -> float:
        return self.recovered_ms - self.injected_ms

    @property
    def ok(self) -> bool:
        return abs(self.error_ms) <= self.tolerance_ms


@dataclass(frozen=True)
class PhaseRun:
    """One phase: its trace, how its requests fared, its medians at the boundary.

    Attributes:
        name: ``baseline`` or ``injected``; also the trace's file name.
        delays_ms: the delays configured in the phase's engine.
        requests: requests sent (warm-up excluded); ``errors`` of them failed.
        windows: requests with a ``server`` window, over which the medians are taken.
        medians_ms: median attributed ms per stage (zeros included), and ``ttft``.
    """

    name: str
    trace: Path
    delays_ms: dict[str, float]
    requests: int
    errors: int
    windows: int
    medians_ms: dict[str, float]


@dataclass(frozen=True)
class ValidateResult:
    """The verdict of ``run_validate``.

    Attributes:
        stages: one check per delayed stage, in the order the delays were given.
        ttft: informational: the server TTFT median against the sum of the delays (all
            of them lie before the first token); never part of ``ok``.
        baseline, injected: the two phases.
        seconds: wall time of the whole run.
        failures: one line per phase with failed requests.
        preemption: the preemption case, when it ran.
    """

    stages: list[StageCheck]
    ttft: StageCheck
    baseline: PhaseRun
    injected: PhaseRun
    seconds: float
    failures: list[str] = field(default_factory=list)
    preemption: PreemptionCheck | None = None

    @property
    def ok(self) -> bool:
        """Every stage recovered within tolerance, no request failed and the preemption
        case, when it ran, passed. (A request without a ``server`` window, e.g. one whose
        first token was EOS, only drops out of the medians; with none left the medians are
        NaN and the checks fail.)"""
        case_ok = self.preemption is None or self.preemption.ok
        return all(s.ok for s in self.stages) and not self.failures and case_ok


def _run_phase(
    name: str,
    out_dir: Path,
    items: Sequence[workloads.WorkItem],
    delays_ms: dict[str, float],
    *,
    model: str,
    device: str,
    seed: int,
    fit: bool,
    disaggregate: bool,
) -> tuple[PhaseRun, list[workloads.WorkItem]]:
    """Serve a fresh engine with ``delays_ms``, send ``items`` one at a time, attribute.

    With ``fit`` the prompts are first made exactly their target length through the
    server's ``/tokenize``; the items sent are returned, for the next phase to reuse.
    """
    from ttft.engine.server import build_engine, forward_worker_spans, serving

    engine = build_engine(model, device=device, seed=seed, inject_delay_ms=delays_ms,
                          disaggregate=disaggregate)
    model_name = f"ttft-{model}"
    trace = out_dir / f"{name}.parquet"
    writer = TraceWriter(
        trace,
        metadata={
            "workload": {
                "command": "ttft validate",
                "phase": name,
                "requests": len(items),
                "prompt_tokens": _PROMPT_TOKENS,
                "max_tokens": _MAX_TOKENS,
                "concurrency": 1,
                "seed": seed,
                "inject_delay_ms": delays_ms,
            },
            **engine.run_metadata(),
        },
    )
    tracing = configure(f"ttft-validate-{name}", [ParquetSpanExporter(writer)])
    forward_worker_spans(engine, tracing)
    try:
        with serving(engine, model_name=model_name) as base_url:
            if fit:
                fitted = asyncio.run(workloads.fit_to_server(base_url, items, model=model_name))
                items = items if fitted is None else fitted
            results = asyncio.run(
                loadgen.run(
                    base_url,
                    items,
                    model=model_name,
                    concurrency=1,
                    warmup=_WARMUP,
                    writer=writer,
                    timeout_s=_TIMEOUT_S,
                )
            )
    finally:
        tracing.shutdown()  # flushes the server's spans and closes the writer
    attribution = analyze(read_spans(trace), boundary=BOUNDARY, policy=POLICY).attribution
    # the warm-up and /tokenize requests reached the server too: keep the workload's
    traced = {r.trace_id for r in results if r.outcome == OUTCOME_OK}
    keep = attribution.requests["trace_id"].isin(traced).to_numpy()
    parts_ms = attribution.attributed[keep] / 1e6
    medians = {stage: _median(parts_ms[stage].to_numpy()) for stage in DELAY_STAGES}
    medians["ttft"] = _median(attribution.requests["ttft_ns"].to_numpy()[keep] / 1e6)
    run = PhaseRun(
        name,
        trace,
        dict(delays_ms),
        len(results),
        sum(1 for r in results if r.outcome != OUTCOME_OK),
        int(keep.sum()),
        medians,
    )
    return run, list(items)


def _median(values: np.ndarray) -> float:
    return float(np.median(values)) if len(values) else float("nan")


def run_validate(
    out_dir: Path,
    *,
    requests: int = 40,
    model: str = "small",
    delays_ms: Mapping[str, float] = DEFAULT_DELAYS_MS,
    seed: int = 0,
    device: str = "cpu",
    applied_delays_ms: Mapping[str, float] | None = None,
    disaggregate: bool = False,
    preemption: bool = False,
) -> ValidateResult:
    """Run the baseline and the injected phase and compare medians stage by stage.

    Args:
        out_dir: where ``baseline.parquet`` and ``injected.parquet`` go (created).
        requests: requests per phase, sent one at a time after a short warm-up.
        model: the engine's model preset.
        delays_ms: the delay per stage to inject and to expect back.
        seed: model weights and prompts.
        device: the engine's device.
        applied_delays_ms: the delays actually configured in the injected engine, when
            they should differ from ``delays_ms`` (which stays what is expected): a way
            to see that a wrong claim is caught.
        disaggregate: serve a disaggregated engine (module docstring).
        preemption: run the preemption case after the two phases (module docstring).

    Returns:
        The checks; ``ok`` says whether every stage was recovered.

    Raises:
        ValueError: an unknown stage, a negative delay, ``requests < 1``, an unknown
            model preset, ``preemption`` with ``disaggregate``.
        OSError: ``out_dir`` cannot be written.
    """
    expected = check_delays(delays_ms, disaggregate=disaggregate)
    applied = (expected if applied_delays_ms is None
               else check_delays(applied_delays_ms, disaggregate=disaggregate))
    if requests < 1:
        raise ValueError(f"requests must be >= 1, got {requests}")
    if preemption and disaggregate:
        raise ValueError("the preemption case needs the co-located engine: drop "
                         "--disaggregate or add --no-preemption")
    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    items = workloads.generated_prompts(
        workloads.burst(requests),
        prompt_tokens=(_PROMPT_TOKENS, _PROMPT_TOKENS),
        max_tokens=_MAX_TOKENS,
        seed=seed,
    )
    common = dict(model=model, device=device, seed=seed, disaggregate=disaggregate)
    base, items = _run_phase("baseline", out_dir, items, {}, fit=True, **common)
    inj, _ = _run_phase("injected", out_dir, items, applied, fit=False, **common)

    def check(stage: str, injected_ms: float) -> StageCheck:
        return StageCheck(
            stage,
            base.medians_ms[stage],
            inj.medians_ms[stage],
            injected_ms,
            tolerance_ms(injected_ms),
        )

    stages = [check(stage, ms) for stage, ms in expected.items()]
    ttft = check("ttft", sum(expected.values()))
    failures = [
        f"{phase.name}: {phase.errors} of {phase.requests} requests failed"
        for phase in (base, inj)
        if phase.errors
    ]
    case = (run_preemption_case(out_dir, model=model, device=device, seed=seed)
            if preemption else None)
    if case is not None and case.errors:
        failures.append(f"preemption: {case.errors} of {case.requests} requests failed")
    return ValidateResult(stages, ttft, base, inj, time.perf_counter() - started, failures,
                          case)
