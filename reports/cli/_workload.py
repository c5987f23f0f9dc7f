"""The workload options of ``ttft trace``, which ``ttft sweep`` runs at every step, declared
once: one field of `Workload` each (its type, help and default), given to a command by
`workload_options` and turned into a `TraceSpec` by `Workload.spec`. A new workload option is
one field here and one keyword in `Workload.spec`.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from copy import copy
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ttft.reports.cli._app import fail

if TYPE_CHECKING:
    from ttft.collectors.trace_run import TraceSpec

UrlArgument = Annotated[str, typer.Argument(
    metavar="URL", help="the server, e.g. http://127.0.0.1:8000 (or its .../v1)")]


@dataclass(frozen=True)
class Workload:
    """What ``ttft trace`` sends and how it receives the server's spans, apart from the
    server's URL and the arrivals' rate or concurrency, which each command takes its own way.
    Each field is one command-line option (``--prompt-tokens`` for ``prompt_tokens``)."""

    model: Annotated[str | None, typer.Option(
        help="model to ask for (default: the server's first)")] = None
    endpoint: Annotated[str, typer.Option(help="completions or chat")] = "completions"
    arrival: Annotated[str, typer.Option(help="gaps at --rate: poisson or constant")] = "poisson"
    requests: Annotated[int | None, typer.Option(min=1, help="requests to send")] = None
    duration: Annotated[float | None, typer.Option(
        min=0.001, help="seconds of arrivals (instead of --requests)")] = None
    warmup: Annotated[int, typer.Option(min=0, help="untraced requests first")] = 1
    prompt_tokens: Annotated[str, typer.Option(
        help="prompt length A, or uniform in A:B (tokens)")] = "128:512"
    output_tokens: Annotated[int, typer.Option(min=1, help="max_tokens of every request")] = 32
    shared_prefix: Annotated[str | None, typer.Option(
        help="P:S: P shared prefixes, S suffixes each")] = None
    prefix_tokens: Annotated[int | None, typer.Option(
        min=1, help="length of each shared prefix (tokens)")] = None
    shared_fraction: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="share of requests with a shared prefix")] = 1.0
    seed: Annotated[int | None, typer.Option(
        help="seed for everything random (default: a fresh one per run, so a second run "
        "against a warm server does not hit its prefix cache)")] = None
    api_key: Annotated[str | None, typer.Option(
        envvar="OPENAI_API_KEY", help="bearer token for the server")] = None
    timeout: Annotated[float, typer.Option(
        min=0.1, help="longest one request may take (s)")] = 120
    receiver_host: Annotated[str, typer.Option(help="OTLP receiver address")] = "127.0.0.1"
    receiver_port: Annotated[int, typer.Option(min=0, max=65535, help="OTLP/HTTP port")] = 4318
    receiver_grpc_port: Annotated[int | None, typer.Option(
        min=0, max=65535, help="also receive OTLP/gRPC on this port")] = None
    span_wait: Annotated[float, typer.Option(
        min=0, help="seconds to wait for the server's spans at the end")] = 10.0

    def spec(self, url: str, **arrivals: Any) -> TraceSpec:
        """The `TraceSpec` of this workload against ``url``; ``arrivals`` are the spec's
        fields the command sets itself (``rate``, ``concurrency``, ``burst``, ``replay``,
        ...).

        Raises:
            typer.Exit: code 2 after an error line, when ``--prompt-tokens`` or
                ``--shared-prefix`` is not ``A`` or ``A:B``.
        """
        from ttft.collectors.trace_run import TraceSpec

        return TraceSpec(
            url=url, model=self.model, endpoint=self.endpoint, arrival=self.arrival,
            requests=self.requests, duration_s=self.duration, warmup=self.warmup,
            prompt_tokens=parse_range(self.prompt_tokens, "--prompt-tokens"),
            output_tokens=self.output_tokens,
            shared_prefix=(parse_range(self.shared_prefix, "--shared-prefix")
                           if self.shared_prefix else None),
            prefix_tokens=self.prefix_tokens, shared_fraction=self.shared_fraction,
            seed=self.seed, api_key=self.api_key, timeout_s=self.timeout,
            receiver_host=self.receiver_host, receiver_port=self.receiver_port,
            receiver_grpc_port=self.receiver_grpc_port, span_wait_s=self.span_wait,
            **arrivals,
        )


def workload_options(
    *, after: Mapping[str, Sequence[str]] | None = None, helps: Mapping[str, str] | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a Typer command one option per `Workload` field, in place of its parameter
    ``workload``, which it then receives as one `Workload`.

    Apply it under ``@app.command()``. In ``--help`` the command's own parameters before
    ``workload`` come first and those after it last, but for those ``after`` places right
    after a workload option (``{"endpoint": ("rate",)}``: ``--rate`` follows
    ``--endpoint``); ``helps`` replaces a workload option's help for this command.
    """
    after, helps = after or {}, helps or {}
    hints = typing.get_type_hints(Workload, include_extras=True)
    shared = []
    for field in fields(Workload):
        hint = hints[field.name]
        if field.name in helps:
            base, info = typing.get_args(hint)
            info = copy(info)
            info.help = helps[field.name]
            hint = Annotated[base, info]
        shared.append(inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY,
                                        default=field.default, annotation=hint))

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        own = inspect.signature(command, eval_str=True).parameters
        names = list(own)
        if twice := sorted(set(names) & {p.name for p in shared}):
            raise TypeError(f"{command.__name__} declares workload options: {twice}")
        at = names.index("workload")
        placed = {name for group in after.values() for name in group}
        ordered = [own[n] for n in names[:at] if n not in placed]
        for param in shared:
            ordered += [param, *(own[n] for n in after.get(param.name, ()))]
        ordered += [own[n] for n in names[at + 1:] if n not in placed]
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in ordered]

        @functools.wraps(command)
        def run(**options: Any) -> Any:
            workload = Workload(**{p.name: options.pop(p.name) for p in shared})
            return command(**options, workload=workload)

        run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run

    return decorate


def parse_range(value: str, option: str) -> tuple[int, int]:
    """``A`` or ``A:B`` → (A, B).

    Raises:
        typer.Exit: code 2 after an error line naming the option.
    """
    head, _, tail = value.partition(":")
    try:
        lo, hi = int(head), int(tail or head)
    except ValueError:
        raise fail(f"{option} {value!r}: expected A or A:B (whole numbers)") from None
    return lo, hi
