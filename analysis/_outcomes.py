"""Each request's outcome, from its client span (DESIGN.md, "TTFT windows"; private to
``analysis``).

The load generator writes ``outcome`` (one of ``tracer.schema.OUTCOMES``), ``status_code``
and ``error`` on the ``client`` span. A trace written before outcomes existed has only
``status_code`` and ``error``: its outcome is read back from them (429/503 → ``shed``,
another status than 200 → ``http_error``, ``timed out`` → ``timeout``, any other error →
``disconnected``). A request without a client span has no outcome the client saw (None),
and counts as ``ok`` where TTFT figures are made: its server view is all there is.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ttft.analysis import _columns as col
from ttft.tracer.schema import (
    ATTR_ERROR,
    ATTR_OUTCOME,
    ATTR_STATUS_CODE,
    OUTCOME_OK,
    OUTCOMES,
)

_FAILURES = OUTCOMES[1:]
_SHED = (429, 503)


def _matches(texts: pa.Array, pattern: str) -> np.ndarray:
    return _found(pc.match_substring_regex(texts, pattern))


def _plainly_ok(texts: pa.Array) -> np.ndarray:
    """Rows that are ``ok`` by `client_outcomes`' rules, found by substring searches alone:
    neither an outcome nor an error key, or one outcome key and it written ``"outcome":"ok"``
    (no failure is named ``ok``, so no rule can match)."""
    key = json.dumps(ATTR_OUTCOME)

    def has(needle: str) -> np.ndarray:
        return _found(pc.match_substring(texts, needle))

    keys = np.asarray(pc.fill_null(pc.count_substring(texts, key), 0)
                      .to_numpy(zero_copy_only=False))
    silent = (keys == 0) & ~has(json.dumps(ATTR_ERROR))
    return silent | ((keys == 1) & has(f"{key}:{json.dumps(OUTCOME_OK)}"))


def _found(mask: pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(mask, False).to_numpy(zero_copy_only=False), dtype=bool)


def client_outcomes(attributes: pa.ChunkedArray, rows: np.ndarray) -> np.ndarray:
    """The outcome of each client span of ``rows`` (ascending), as an object array."""
    out = np.full(len(rows), OUTCOME_OK, dtype=object)
    if len(rows) == 0:
        return out
    texts = col.take(attributes, rows)
    if pa.types.is_dictionary(texts.type) or pa.types.is_large_string(texts.type):
        texts = texts.cast(pa.string())
    unclear = np.flatnonzero(~_plainly_ok(texts))  # the rules only where they may say more
    if len(unclear):
        out[unclear] = _by_rules(attributes, rows[unclear], texts.take(pa.array(unclear)))
    return out


def _by_rules(attributes: pa.ChunkedArray, rows: np.ndarray, texts: pa.Array) -> np.ndarray:
    """`client_outcomes` of ``rows`` (their attributes: ``texts``) by the regular
    expressions of the module's rules."""
    out = np.full(len(rows), OUTCOME_OK, dtype=object)
    said = _matches(texts, rf'"{ATTR_OUTCOME}"\s*:')
    for kind in _FAILURES:
        out[_matches(texts, rf'"{ATTR_OUTCOME}"\s*:\s*"{kind}"')] = kind
    legacy = ~said & _matches(texts, rf'"{ATTR_ERROR}"\s*:\s*"')
    if legacy.any():
        status = col.int_attribute(attributes, rows, ATTR_STATUS_CODE)
        timed_out = _matches(texts, rf'"{ATTR_ERROR}"\s*:\s*"timed out')
        guess = np.where(
            np.isin(status, _SHED),
            "shed",
            np.where(
                (status >= 0) & (status != 200),
                "http_error",
                np.where(timed_out, "timeout", "disconnected"),
            ),
        )
        out[legacy] = guess[legacy]
    return out


def failure_details(attributes: pa.ChunkedArray, rows: np.ndarray) -> tuple[list, list]:
    """``status_code`` (int or None) and ``error`` (str or None) of each of ``rows``: the
    few failed client spans, parsed one by one (malformed attributes give None)."""
    statuses, errors = [], []
    for text in col.take(attributes, rows).to_pylist():
        try:
            value = json.loads(text) if text else {}
        except ValueError:
            value = {}
        value = value if isinstance(value, dict) else {}
        status, error = value.get(ATTR_STATUS_CODE), value.get(ATTR_ERROR)
        statuses.append(status if isinstance(status, int) and not isinstance(status, bool)
                        else None)
        errors.append(error if isinstance(error, str) else None)
    return statuses, errors


def request_outcomes(
    attributes: pa.ChunkedArray, client_rows: np.ndarray, req: np.ndarray, n_req: int,
    start: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request: its outcome (None without a client span), status code and error (None
    for ``ok``). A request with several client spans (client traces joined by request id)
    is failed when any of them failed, and takes the failure of the one that started first
    (``start``, per row), ties broken by outcome, status and error: by value, never by row
    order."""
    outcome = np.full(n_req, None, dtype=object)
    status = np.full(n_req, None, dtype=object)
    error = np.full(n_req, None, dtype=object)
    kinds = client_outcomes(attributes, client_rows)
    owner = req[client_rows]
    outcome[owner] = OUTCOME_OK
    failed = np.flatnonzero(kinds != OUTCOME_OK)
    if len(failed):
        codes, texts = failure_details(attributes, client_rows[failed])
        keys = [
            (int(start[client_rows[f]]), str(kinds[f]), -1 if c is None else c, t or "", i)
            for i, (f, c, t) in enumerate(zip(failed.tolist(), codes, texts, strict=True))
        ]
        chosen: dict[int, int] = {}
        for key in sorted(keys):
            chosen.setdefault(int(owner[failed[key[-1]]]), key[-1])
        for request, i in chosen.items():
            outcome[request] = kinds[failed[i]]
            status[request], error[request] = codes[i], texts[i]
    return outcome, status, error
