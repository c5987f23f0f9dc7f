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

A preempted request (``EngineConfig.preemption``) has a ``preempted`` span from its
preemption to its admission again, where another ``schedule``, ``batch_wait`` and a
``prefill`` of the recompute (``recompute=True``) follow, tiled as above; its ``batch_wait``
or ``prefill`` running when it was preempted ends there (``preempted=True``). Preempted
while prefilling, all of it lies before ``first_sampled``; preempted while decoding, after.

Like every tracer call, these never block or raise because of tracing.
"""

from __future__ import annotations

from ttft.engine.stream import RequestState
from ttft.tracer import SpanRef, clock_ns, record, stage
from ttft.tracer.api import add_link
from ttft.tracer.context import request_parent

__all__ = [
    "begin_preempted",
    "link_served",
    "note_chunk",
    "record_batch_wait",
    "record_preempted",
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


def begin_preempted(req: RequestState, start_ns: int, **attributes: object) -> None:
    """``req`` was preempted at ``start_ns``: its ``batch_wait`` or ``prefill`` running
    then is cut there (``preempted=True``) and its ``preempted`` span begins, to carry
    ``attributes`` (``req.preempted_attrs``) when ``record_preempted`` ends it. Called
    before its blocks are released."""
    record_batch_wait(req, start_ns, preempted=True)
    record_prefill(req, start_ns, preempted=True)
    req.preempted_ns, req.preempted_attrs = start_ns, dict(attributes)


def record_preempted(req: RequestState, end_ns: int, **attributes: object) -> SpanRef:
    """The ``preempted`` span: from the request's preemption (``req.preempted_ns``) to
    ``end_ns`` (its admission again, or cancelled while waiting, with ``cancelled=True``),
    with the attributes noted at the preemption (``req.preempted_attrs``). Returns it."""
    attrs = {**req.preempted_attrs, **attributes}
    ref = record("preempted", req.preempted_ns, end_ns, request_id=req.rid, parent=req.parent,
                 **attrs)
    req.preempted_ns, req.preempted_attrs = 0, {}
    return ref


def record_schedule(req: RequestState, t0_ns: int, **attributes: object) -> None:
    """The ``schedule`` span of an admitted request: from ``t0_ns`` (when the admission
    work for it began, also the end of its ``queue`` or ``preempted`` span) to now, where
    its ``batch_wait`` begins (``req.scheduled_ns``)."""
    end_ns = clock_ns()
    record(
        "schedule",
        t0_ns,
        end_ns,
        request_id=req.rid,
        parent=req.parent,
        prompt_tokens=len(req.prompt_ids),
        cached_tokens=req.cached_tokens,
        **attributes,
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
    after it; ``recompute=True`` after a preemption), for ``record_prefill``. Returns its
    end (``clock_ns()``)."""
    attrs: dict[str, object] = dict(
        step_id=step_id,
        chunk_tokens=chunk_tokens,
        cached_tokens=req.cached_tokens,
        context_tokens=req.seq.length if req.seq is not None else 0,
    )
    if req.recompute_ids is not None:
        attrs["recompute"] = True
    end_ns = clock_ns()
    req.chunks.append((t0_ns, end_ns, attrs))
    return end_ns


def record_prefill(req: RequestState, end_ns: int = 0, **attributes: object) -> None:
    """The ``prefill`` envelope of the chunks run so far and a ``prefill.chunk`` child per
    chunk (``recompute=True`` on both after a preemption); then forgets them (called once
    per prefill, when it ends or is cut). The envelope ends with the last chunk, or at
    ``end_ns`` when later: a preemption cuts it there (``preempted=True``), so the wait for
    a next chunk that never came stays the envelope's, as the gaps between chunks are."""
    if not req.chunks:
        return
    if req.recompute_ids is not None:
        attributes["recompute"] = True
    ref = record(
        "prefill",
        req.chunks[0][0],
        max(req.chunks[-1][1], end_ns),
        request_id=req.rid,
        parent=req.parent,
        cached_tokens=req.cached_tokens,
        chunks=len(req.chunks),
        **attributes,
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
