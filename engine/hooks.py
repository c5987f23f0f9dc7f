"""``EngineHooks``: where an engine built on ``Engine`` changes what ``Engine`` does.

``Engine`` is an ``EngineHooks``; an extension (``ttft.engine.disagg``'s ``PrefillEngine``
and ``DisaggEngine``) subclasses ``Engine`` and overrides these hooks, and nothing private.
What an extension may call on the engine, besides its public attributes (``model``,
``tokenizer``, ``config``, ``cache``, ``prefix_cache``):

- ``Engine.queue(req, ready_ns)``: a ``RequestState`` into the waiting queue (``submit``
  builds and queues one; an engine fed otherwise builds its own). Not on the worker
  thread. An extension may override it to act around queueing: refuse by raising before
  ``super().queue``, undo on its ``QueueFull``, act after it returns.
- ``Engine.wake()``: the worker runs an iteration soon (any thread).
- ``Engine.emit(req, token)``: a sampled token to a running request, which finishes on EOS
  or ``max_tokens`` (worker thread).
- ``Engine.drop(req, error)``: a request ends now, waiting or running (worker thread).

One iteration of the worker thread, with the hooks where they are called: cancelled
requests leave (running ones through ``on_drop``); ``on_iteration``; the step is planned
(``ttft.engine.policy``); requests are preempted and admitted, then ``on_admit`` for each
admitted one; the step runs its prefill chunks (none when ``runs_prefill`` is False),
``on_chunk_done`` after each, and its batched decode, each token handed out by
``deliver``. A request leaving the engine passes ``on_drop`` before its K/V blocks are
freed and its error, if any, is delivered.

Threading: every hook runs on the engine's worker thread (``deliver`` may also be called
from an extension's own threads), which owns the model and the caches, so a hook may read
and write the admitted requests' ``RequestState`` and the caches; it runs inside the
iteration, so what it waits for, every request waits for. A hook should not raise: an
exception inside one request's part of a step fails that request, one elsewhere fails
every running request.
"""

from __future__ import annotations

from ttft.engine.stream import RequestState

__all__ = ["EngineHooks", "TokenItem"]

TokenItem = tuple[int, bool, str | None, int]
"""What ``deliver`` hands out per token: ``(token id, finished, finish reason or None,
cached tokens)``, the finish reason ``"stop"`` (EOS) or ``"length"`` (``max_tokens``)."""


class EngineHooks:
    """The hooks ``Engine`` calls, each with ``Engine``'s own behaviour as its default.

    Attributes:
        runs_prefill: whether this engine computes its requests' prompt K/V (prefill
            chunks). False: a request's K/V arrives from elsewhere; the engine runs only
            decode tokens, and an admitted request decodes once a hook has set its
            ``computed`` to its prompt length and its first token is in ``out_ids``
            (``emit`` puts it there).
    """

    runs_prefill: bool = True

    def on_iteration(self) -> bool:
        """At the start of each worker iteration, after cancelled requests were dropped and
        before the step is planned. Default: nothing.

        Returns:
            Whether it changed a request (say, made one ready to decode): the worker then
            iterates again instead of sleeping until woken.
        """
        return False

    def on_admit(self, req: RequestState) -> None:
        """After the iteration admitted ``req`` (and the others admitted with it): ``req``
        is running, holds its prefix-cache hit (``req.seq``, ``req.computed``), its
        ``queue`` and ``schedule`` spans are recorded, and every block it may grow into is
        free, so the hook may allocate them (``cache.append(req.seq, n)``). Default:
        nothing."""

    def on_chunk_done(self, req: RequestState, end_ns: int) -> int:
        """After each prefill chunk of ``req`` (``req.computed`` counts it), which ended at
        ``end_ns``, inside the step; the blocks the chunk filled are written.

        Returns:
            When sampling may begin: ``end_ns`` (the default), or later when the hook did
            work the first token must wait for (its ``sample`` span begins there).
        """
        return end_ns

    def deliver(self, req: RequestState, item: TokenItem | BaseException) -> None:
        """Hand ``item`` to whoever reads ``req``: a ``TokenItem``, or the exception the
        request ended with (given by ``Engine.drop``). Called on the worker thread, inside
        the step (what it waits for, the step waits for); an extension may call it from
        its own threads too.

        Default: onto ``req.queue`` on the request's event loop
        (``loop.call_soon_threadsafe``; its ``RequestStream`` reads it); when that loop is
        closed nobody listens, and ``req`` is marked cancelled.
        """
        try:
            req.loop.call_soon_threadsafe(req.queue.put_nowait, item)
        except RuntimeError:  # the request's event loop is closed: nobody is listening
            req.cancelled = True

    def on_drop(self, req: RequestState, error: BaseException | None) -> None:
        """``req`` leaves the engine: it finished, failed (``error``), was cancelled while
        running, or the engine stopped (``EngineStopped``, waiting requests too). Called
        before its K/V blocks are freed (after the hook returns nothing may write them) and
        before ``error`` is delivered. Default: nothing."""
