"""Disaggregated serving's K/V transfer as text rows, for the terminal and the HTML report:
`Summary.kv_transfer` (``ttft.analysis.transfer.transfer_summary``) per figure."""

from __future__ import annotations

import html
from typing import Any

__all__ = ["TITLE", "rate_text", "transfer_html", "transfer_rows"]

TITLE = "K/V transfer (disaggregated prefill → decode), per request"
_UNITS = ((1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s"))


def rate_text(bytes_per_s: float) -> str:
    """A bandwidth in decimal units: ``12.35 GB/s``, ``830.00 B/s``."""
    for scale, unit in _UNITS:
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:,.2f} {unit}"
    return f"{bytes_per_s:,.2f} B/s"


def _bytes_text(n_bytes: int) -> str:
    return rate_text(n_bytes).removesuffix("/s")


def transfer_rows(kv: dict[str, Any]) -> list[tuple[str, str]]:
    """``(figure, value)`` rows of ``kv`` (a `Summary.kv_transfer`)."""
    n, estimated = kv["requests"], kv["estimated"]
    dur, bandwidth = kv["duration_ms"], kv["bytes_per_s"]
    rows = [
        ("requests with a transfer",
         f"{n:,}" + (f" ({estimated:,} estimated by the source)" if estimated else "")),
        ("carried", f"{kv['blocks']:,} blocks, {_bytes_text(kv['bytes'])}"),
        ("duration p50 / p90 / max",
         f"{dur['p50']:,.3f} / {dur['p90']:,.3f} / {dur['max']:,.3f} ms"),
    ]
    if bandwidth is None:
        rows.append(("bandwidth", "n/a (no measured transfer reports its bytes)"))
        return rows
    rows.append(("bandwidth p50 / p90",
                 f"{rate_text(bandwidth['p50'])} / {rate_text(bandwidth['p90'])}"))
    rows.append(("bandwidth min / max",
                 f"{rate_text(bandwidth['min'])} / {rate_text(bandwidth['max'])}"))
    rows.append(("all bytes / all time", f"{rate_text(kv['aggregate_bytes_per_s'])} "
                 f"over {bandwidth['requests']:,} measured transfers"))
    return rows


def transfer_html(kv: dict[str, Any] | None) -> str:
    """The HTML report's section (``id="kv-transfer"``); empty when ``kv`` is None (the
    trace has no transfer)."""
    if kv is None:
        return ""
    body = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>"
                   for k, v in transfer_rows(kv))
    return (
        f"<h2>{html.escape(TITLE)}</h2>"
        f'<table class="meta" id="kv-transfer"><tr><th>figure</th><th>value</th></tr>{body}'
        '</table><p class="note">A transfer runs from the first K/V block sent to the last '
        "installed; its bandwidth is its bytes over that time, over the transfers the engine "
        "measured (a source's estimates are counted, not used).</p>"
    )
