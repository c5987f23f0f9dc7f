"""The spans the engine records (docs/design.md, "Stages"), all on the host clock.

Per request: ``tokenize``, and ``deliver`` and ``detokenize`` of the first token
(``ttft.engine.stream``), on the asyncio side; ``queue``, ``schedule``, ``batch_wait``,
``prefill`` with its ``prefill.chunk`` children, ``sample`` (of the first token) and the
``first_sampled`` event from the worker thread, recorded here with explicit times
(``clock_ns()``) under the span the request's spans nest under (``RequestState.parent``:
the request's span that was current, or registered by ``request_context``, when it was
submitted). Engine level: one ``step`` span per iteration in the engine's own trace, linked
to the requests it served (``link_served``).

The request's spans up to ``first_sampled`` tile its time without a gap: ``tokenize`` ends
where ``queue`` begins, ``queue`` where ``schedule`` begins, ``schedule`` where
``batch_wait`` begins, ``batch_wait`` where the first ``prefill.chunk`` begins, the
``prefill`` envelope holds the gaps between chunks, and ``sample`` begins where the last
chunk ends.

Like every tracer call, these never block or raise because of tracing.
"""

from __future__ import annotations

from ttft.engine.stream import RequestState
from ttft.tracer import SpanRef, clock_ns, record, stage
from ttft.tracer.api import add_link
from ttft.tracer.context import request_parent

__all__ = [
    "link_served",
    "note_chunk",
    "record_batch_wait",
    "record_prefill",
    "record_queue",
    "record_sample",
    "record_schedule",
]


def record_queue(req: RequestState, end_ns: int, **attributes: object) -> SpanRef:
    """The ``queue`` span: the request entered the waiting queue → ``end_ns`` (admitted,
    or cancelled while waiting, with ``cancelled=True``). Returns the span."""
    return record(
        "queue", req.arrival_ns, end_ns, request_id=req.rid, parent=req.parent, **attributes
    )


def record_schedule(req: RequestState, t0_ns: int) -> None:
    """The ``schedule`` span of an admitted request: from ``t0_ns`` (when the admission
    work for it began, also the end of its ``queue`` span) to now, where its
    ``batch_wait`` begins (``req.scheduled_ns``)."""
    end_ns = clock_ns()
    record(
        "schedule",
        t0_ns,
        end_ns,
        request_id=req.rid,
        parent=req.parent,
        prompt_tokens=len(req.prompt_ids),
        cached_tokens=req.cached_tokens,
    )
    req.scheduled_ns = end_ns


def record_batch_wait(req: RequestState, end_ns: int, **attributes: object) -> None:
    """The ``batch_wait`` span, once: from the end of the request's ``schedule`` to
    ``end_ns`` (the start of its first prefill chunk, with that step's ``step_id``; or
    when it was dropped before one, with ``dropped=True``). Nothing when it was recorded
    already or the request was never admitted."""
    if not req.scheduled_ns:
        return
    record(
        "batch_wait", req.scheduled_ns, end_ns, request_id=req.rid, parent=req.parent,
        **attributes,
    )
    req.scheduled_ns = 0


def note_chunk(req: RequestState, t0_ns: int, chunk_tokens: int, step_id: int) -> int:
    """Remember a prefill chunk that began at ``t0_ns`` and ends now, with the
    ``prefill.chunk`` attributes (step id, chunk tokens, cached tokens, context length
    after it), for ``record_prefill``. Returns its end (``clock_ns()``)."""
    attrs = dict(
        step_id=step_id,
        chunk_tokens=chunk_tokens,
        cached_tokens=req.cached_tokens,
        context_tokens=req.seq.length if req.seq is not None else 0,
    )
    end_ns = clock_ns()
    req.chunks.append((t0_ns, end_ns, attrs))
    return end_ns


def record_prefill(req: RequestState) -> None:
    """The ``prefill`` envelope of the chunks run so far and a ``prefill.chunk`` child per
    chunk; then forgets them (called once, when prefill ends or is cut)."""
    if not req.chunks:
        return
    ref = record(
        "prefill",
        req.chunks[0][0],
        req.chunks[-1][1],
        request_id=req.rid,
        parent=req.parent,
        cached_tokens=req.cached_tokens,
        chunks=len(req.chunks),
    )
    for t0_ns, t1_ns, attrs in req.chunks:
        record("prefill.chunk", t0_ns, t1_ns, request_id=req.rid, parent=ref, **attrs)
    req.chunks = []


def record_sample(req: RequestState, t0_ns: int, t1_ns: int, token: int) -> None:
    """The ``sample`` span of the first token and the ``first_sampled`` event at its end
    (``req.sampled_ns``, where the token's ``deliver`` to the event loop begins)."""
    ref = record("sample", t0_ns, t1_ns, request_id=req.rid, parent=req.parent, token_id=token)
    record("first_sampled", t1_ns, t1_ns, request_id=req.rid, parent=ref, stage_name="event")
    req.sampled_ns = t1_ns


def link_served(span: stage, reqs: list[RequestState]) -> None:
    """Link an open ``step`` span to each request it serves, and list their ids in its
    ``request_ids`` attribute: a request's link goes to its outermost open span, else (none
    open any more) to the span its spans nest under, else to its ``queue`` span."""
    unlinked = [r for r in reqs if not add_link(span, request_parent(r.rid), request_id=r.rid)]
    for req in unlinked:
        ref: SpanRef | None = req.parent if req.parent.span_id else req.queue_ref
        add_link(span, ref, request_id=req.rid)
    span.set(request_ids=[r.rid for r in reqs])
