"""``ttft join``: join a client trace with span files written elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ttft.reports.cli._app import analyze_trace, app, err, fail, print_summary


@app.command()
def join(
    client: Annotated[Path, typer.Argument(metavar="CLIENT", help="the client's trace")],
    others: Annotated[
        list[Path], typer.Argument(metavar="OTHER...", help="span files written elsewhere")
    ],
    out: Annotated[Path, typer.Option("-o", "--out", help="joined trace to write (.parquet)")],
) -> None:
    """Join a client trace (from ttft trace) with span files written elsewhere (another
    receiver, a server's own trace) into one trace: spans join the client's requests by
    trace id, else by the server's request id (for servers that drop trace context)."""
    from ttft.collectors import TraceFileError
    from ttft.collectors.join import join_traces

    try:
        report = join_traces(client, others, out)
    except TraceFileError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"{exc.filename or out}: {exc.strerror or exc}") from None
    err.print(
        f"wrote {out}: {report.client_rows:,} client rows; from the other files "
        f"{report.by_trace_id:,} rows joined by trace id, {report.by_request_id:,} by request "
        f"id, {report.unmatched:,} matched no client request (kept)"
    )
    print_summary(analyze_trace(out))
