"""Measured server spans win over the timings a server reported (docs/attribution.md,
"Server-reported timings"; private to ``analysis``).

The load generator places a server's reported timings as spans of service
``tracer.schema.REPORTED_SERVICE`` on the client's clock. A request whose server also
exported spans (any span of it on another clock than the client's) is attributed from
those alone: its reported spans stay in the table, for comparison, but take no window time,
so nothing is counted twice. Blame never splits a reported wait: it has no engine steps to
split it by, and "idle" would claim what nobody saw.
"""

from __future__ import annotations

import numpy as np

from ttft.tracer.schema import REPORTED_SERVICE


def attributed_rows(rows: np.ndarray, row_req: np.ndarray, n_req: int, is_client: np.ndarray,
                    service: np.ndarray, service_values: list[str]) -> np.ndarray:
    """``rows`` (span rows of requests) without the reported spans of a request that has a
    measured server-side span among them.

    Args:
        rows: row indices, each of a request (``row_req >= 0``).
        row_req: each row's request.
        n_req: the number of requests.
        is_client: per row, on the client's clock.
        service, service_values: per row, a code into ``service_values`` (-1 for null).
    """
    if REPORTED_SERVICE not in service_values:
        return rows
    reported = service[rows] == service_values.index(REPORTED_SERVICE)
    if not reported.any():
        return rows
    measured = np.zeros(n_req, bool)
    measured[row_req[rows[~is_client[rows]]]] = True
    return rows[~(reported & measured[row_req[rows]])]


def without_reported(rows: np.ndarray, service: np.ndarray,
                     service_values: list[str]) -> np.ndarray:
    """``rows`` without the spans placed from reported timings (for blame)."""
    if REPORTED_SERVICE not in service_values:
        return rows
    return rows[service[rows] != service_values.index(REPORTED_SERVICE)]
