"""What each row and each clock is to the clock rules (``analysis.clocks``,
``analysis._worker_clocks``): a row's part (``K_*``: `row_kinds`, `clock_kinds` of a
decoded table) and which clocks are a host's (`host_clocks`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ttft.analysis._trees import CODE
from ttft.tracer.schema import CLIENT_CLOCK, EV_FIRST_BYTE, EV_FIRST_TOKEN

if TYPE_CHECKING:
    from ttft.analysis._grouping import Decoded

GPU_CLOCK_PREFIX = "gpu:"

# What a row is to the midpoint rule (`row_kinds`); K_PREFILL: a prefill or prefill.chunk
# span, whose end bounds a worker clock (`analysis._worker_clocks`).
K_NONE, K_CLIENT, K_SERVER, K_SENT, K_FIRST_TOKEN, K_FIRST_BYTE, K_PREFILL = range(7)


def row_kinds(
    is_client: np.ndarray,
    is_client_span: np.ndarray,
    is_server_span: np.ndarray,
    is_prefill_span: np.ndarray,
    ev_rows: np.ndarray,
    ev_name: np.ndarray,
    ev_values: Sequence[str],
) -> np.ndarray:
    """Per row, its part in the midpoint rule (``K_*``).

    Args:
        is_client: rows on the client clock.
        is_client_span, is_server_span: rows of stage ``client`` / ``server``.
        is_prefill_span: rows of stage ``prefill`` or ``prefill.chunk``.
        ev_rows: the rows that are point events; ``ev_name`` their name codes (-1 null)
            into ``ev_values``.
    """
    kind = np.zeros(len(is_client), np.int8)
    kind[is_client_span & is_client] = K_CLIENT
    kind[is_server_span & ~is_client] = K_SERVER
    kind[is_prefill_span & ~is_client] = K_PREFILL
    names = {"sent": K_SENT, EV_FIRST_TOKEN: K_FIRST_TOKEN, EV_FIRST_BYTE: K_FIRST_BYTE}
    lut = np.array([names.get(v, K_NONE) for v in ev_values] + [K_NONE], np.int8)
    ev_kind = lut[ev_name]
    side = is_client[ev_rows]
    ok = np.where(ev_kind == K_FIRST_BYTE, ~side, side)  # each event on its own side
    kind[ev_rows] = np.where(ok, ev_kind, K_NONE)
    return kind


def clock_kinds(d: Decoded) -> np.ndarray:
    """`row_kinds` of a decoded table (``analysis._grouping.decode``): which rows bound the
    client's and the server's intervals, for the clock offsets."""
    prefill = (d.stage == CODE["prefill"]) | (d.stage == CODE["prefill.chunk"])
    return row_kinds(d.is_client, d.stage == CODE["client"], d.stage == CODE["server"],
                     prefill, d.ev_rows, d.ev_name, d.ev_values)


def host_clocks(clock_values: Sequence[str]) -> np.ndarray:
    """Per clock code, whether it is a host clock (neither ``client`` nor ``gpu:*``), with
    a last entry False for a null clock (code -1)."""
    return np.array(
        [v != CLIENT_CLOCK and not v.startswith(GPU_CLOCK_PREFIX) for v in clock_values] + [False]
    )
