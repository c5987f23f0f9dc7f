"""Each request's outcome, from its client span (docs/design.md, "TTFT windows"; private to
``analysis``).

The load generator writes ``outcome`` (one of ``tracer.schema.OUTCOMES``), ``status_code``
and ``error`` on the ``client`` span; ``cancelled`` on the span of a request the run's stop
cut short. A trace written before outcomes existed has only
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

from ttft.analysis import _column_arrays as col
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
    neither an outcome nor an error key and no backslash (no escape can spell one), or one
    outcome key written ``"outcome":"ok"`` in a flat object (`_column_arrays.json_shapes`: no
    other object, no backslash, so the key is the top-level one; no failure is named
    ``ok``, so no rule can match)."""
    key = json.dumps(ATTR_OUTCOME)

    def has(needle: str) -> np.ndarray:
        return _found(pc.match_substring(texts, needle))

    keys = np.asarray(pc.fill_null(pc.count_substring(texts, key), 0)
                      .to_numpy(zero_copy_only=False))
    flat, escaped = col.json_shapes(texts)
    silent = (keys == 0) & ~has(json.dumps(ATTR_ERROR)) & ~escaped
    return silent | ((keys == 1) & flat & has(f"{key}:{json.dumps(OUTCOME_OK)}"))


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
    """`client_outcomes` of ``rows`` (their attributes: ``texts``) by the module's rules on
    the top-level keys of each JSON object; a text that is no JSON object (malformed) is
    read by regular expressions instead (`_by_patterns`)."""
    out = np.full(len(rows), OUTCOME_OK, dtype=object)
    malformed = []
    for i, text in enumerate(texts.to_pylist()):
        try:
            value = json.loads(text) if text is not None else {}
        except ValueError:
            value = None
        if not isinstance(value, dict):
            malformed.append(i)
            continue
        out[i] = _outcome_of(value)
    if malformed:
        at = np.asarray(malformed, np.int64)
        out[at] = _by_patterns(attributes, rows[at], texts.take(pa.array(at)))
    return out


def _outcome_of(value: dict) -> str:
    """The rules on one parsed attributes object."""
    outcome = value.get(ATTR_OUTCOME)
    if ATTR_OUTCOME in value:
        return outcome if isinstance(outcome, str) and outcome in _FAILURES else OUTCOME_OK
    error = value.get(ATTR_ERROR)
    if not isinstance(error, str):
        return OUTCOME_OK
    status = col.json_int(value.get(ATTR_STATUS_CODE))
    status = -1 if status is None else status
    if status in _SHED:
        return "shed"
    if status >= 0 and status != 200:
        return "http_error"
    return "timeout" if error.startswith("timed out") else "disconnected"


def _by_patterns(attributes: pa.ChunkedArray, rows: np.ndarray, texts: pa.Array) -> np.ndarray:
    """The rules by regular expressions, for texts that are no JSON object."""
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
        statuses.append(col.json_int(status))
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
