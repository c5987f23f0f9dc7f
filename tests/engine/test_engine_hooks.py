"""The engine's extension interface (``ttft.engine.hooks``): ``engine/disagg`` neither
touches a private attribute of ``Engine`` nor overrides a private method of it (checked on
the source); on the tiny model the hooks are called where and on the thread they are
documented to be, with the engine's output unchanged; an engine whose prompt K/V arrives
from elsewhere (``runs_prefill=False``, filled in by ``on_iteration``) decodes to the same
tokens; ``Engine.drop`` ends a waiting request with its error."""

from __future__ import annotations

import ast
import asyncio
import importlib
import inspect
import threading
from pathlib import Path

import pytest

import ttft.engine.disagg as disagg
import ttft.engine.engine as engine_module
from ttft.engine import Engine, EngineConfig
from ttft.engine.disagg.decode import DisaggEngine
from ttft.engine.disagg.prefill import PrefillEngine
from ttft.engine.hooks import EngineHooks
from ttft.engine.model import prefill_chunk
from ttft.engine.sampler import sample

SMALL = dict(max_batch_tokens=40, chunk_size=16, block_size=8, num_blocks=512)
DISAGG_DIR = Path(disagg.__file__).parent


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def engine_private_names() -> set[str]:
    """Every private method of ``Engine`` (and its bases) and every private attribute it
    sets on ``self``."""
    names = {n for cls in Engine.__mro__ for n in vars(cls) if _private(n)}
    tree = ast.parse(inspect.getsource(engine_module))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "self" and _private(node.attr)):
            names.add(node.attr)
    return names


def test_engine_private_names_are_found():
    names = engine_private_names()
    assert {"_running", "_waiting", "_kv", "_wake", "_drop", "_iterate", "_step"} <= names


def engine_subclass_nodes(tree: ast.Module, module) -> set[ast.AST]:
    """The class bodies of ``tree`` (``module``'s source) that define ``Engine``s."""
    return {node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
            and issubclass(getattr(module, node.name, object), Engine)}


def test_disagg_uses_no_private_name_of_engine():
    """Inside a subclass of ``Engine`` no ``self._x`` or ``def _x`` of ``Engine``'s private
    names; elsewhere no ``<anything but self>._x`` of them (``engine._running``)."""
    private = engine_private_names()
    used, subclasses = [], 0
    for path in sorted(DISAGG_DIR.glob("*.py")):
        module = importlib.import_module(f"ttft.engine.disagg.{path.stem}")
        tree = ast.parse(path.read_text(), str(path))
        engines = engine_subclass_nodes(tree, module)
        subclasses += len(engines)
        inside = {id(n) for cls in engines for n in ast.walk(cls)}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and id(node) in inside and node.name in private:
                used.append(f"{path.name}:{node.lineno}: def {node.name}")
            if not isinstance(node, ast.Attribute) or node.attr not in private:
                continue
            on_self = isinstance(node.value, ast.Name) and node.value.id == "self"
            if id(node) in inside or not on_self:
                used.append(f"{path.name}:{node.lineno}: .{node.attr}")
    assert subclasses == 2  # DisaggEngine, PrefillEngine
    assert used == []


@pytest.mark.parametrize("cls", [DisaggEngine, PrefillEngine])
def test_disagg_engines_override_only_hooks_and_the_lifecycle(cls):
    overridden = {n for n in vars(cls) if hasattr(Engine, n) and not n.startswith("__")}
    hooks = {n for n in vars(EngineHooks) if not n.startswith("_")}
    allowed = hooks | {"queue", "start", "stop", "run_metadata"}
    assert overridden <= allowed
    assert not {n for n in vars(cls) if _private(n) and hasattr(Engine, n)}


# -- the hooks on a real engine -------------------------------------------------------------




class Recording(Engine):
    """An ``Engine`` whose hooks log each call (and its thread), then do the default."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple] = []
        self.threads: set[str] = set()

    def _log(self, *call) -> None:
        self.calls.append(call)
        self.threads.add(threading.current_thread().name)

    def on_admit(self, req) -> None:
        self._log("admit", req.rid, req.seq is not None)

    def on_chunk_done(self, req, end_ns: int) -> int:
        self._log("chunk", req.rid, req.computed)
        return super().on_chunk_done(req, end_ns)

    def deliver(self, req, item) -> None:
        self._log("deliver", req.rid, item if isinstance(item, tuple) else repr(item))
        super().deliver(req, item)

    def on_drop(self, req, error) -> None:
        self._log("drop", req.rid, error, req.seq is not None)


def run(engine: Engine, main):
    engine.start()
    try:
        return asyncio.run(main(engine))
    finally:
        engine.stop()


async def tokens(engine: Engine, ids: list[int], max_tokens: int, **kw) -> list[int]:
    return [e.token_id async for e in await engine.submit(ids, max_tokens, **kw)]


def test_hooks_are_called_in_order_on_the_worker_thread(model, tok):
    ids = tok.ids_of_length(40, seed=1)
    config = EngineConfig(**SMALL)
    plain = run(Engine(model, tok, config), lambda e: tokens(e, ids, 6))
    engine = Recording(model, tok, config)
    out = run(engine, lambda e: tokens(e, ids, 6, request_id="r"))

    assert out == plain  # the hooks' defaults are the engine's behaviour
    assert engine.threads == {"ttft-engine"}
    # chunks of 16, 16 and 8 tokens, then one deliver per token, the last one finished
    reason = "stop" if out[-1] == tok.eos_id else "length"
    delivered = [("deliver", "r", (t, i == len(out) - 1, reason if i == len(out) - 1 else None, 0))
                 for i, t in enumerate(out)]
    assert engine.calls == [
        ("admit", "r", True),
        ("chunk", "r", 16), ("chunk", "r", 32), ("chunk", "r", 40),
        *delivered,
        ("drop", "r", None, True),  # before its blocks are freed
    ]


class Elsewhere(Engine):
    """An engine whose prompts' K/V "arrives from elsewhere": ``on_iteration`` prefills an
    admitted request in one go and gives it its first token, as a transfer would."""

    runs_prefill = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.admitted: list = []
        self.chunks = 0

    def on_admit(self, req) -> None:
        self.admitted.append(req)

    def on_iteration(self) -> bool:
        ready, self.admitted = self.admitted, []
        for req in ready:
            logits = prefill_chunk(self.model, self.cache, req.seq, req.prompt_ids[req.computed:])
            req.computed = len(req.prompt_ids)
            self.emit(req, sample(logits, req.params, req.generator))
        return bool(ready)

    def on_chunk_done(self, req, end_ns: int) -> int:
        self.chunks += 1
        return end_ns


def test_an_engine_that_does_not_prefill_decodes_what_arrives(model, tok):
    prompts = [tok.ids_of_length(n, seed=n) for n in (40, 23)]
    config = EngineConfig(**SMALL)

    async def main(engine):
        return await asyncio.gather(*(tokens(engine, ids, 8) for ids in prompts))

    plain = run(Engine(model, tok, config), main)
    engine = Elsewhere(model, tok, config)
    assert run(engine, main) == plain
    assert engine.chunks == 0  # no prefill chunk ran here


class DropsWaiting(Recording):
    """Fails each request once it waits, from ``on_iteration`` (``Engine.drop``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.queued: list = []

    def queue(self, req, ready_ns: int) -> None:
        super().queue(req, ready_ns)
        self.queued.append(req)
        self.wake()  # it waits now: the next iteration sees it

    def on_iteration(self) -> bool:
        while self.queued:
            req = self.queued.pop()
            self.drop(req, ValueError(f"refused {req.rid}"))
        return False


def test_drop_ends_a_waiting_request_with_its_error(model, tok):
    engine = DropsWaiting(model, tok, EngineConfig(**SMALL))
    ids = tok.ids_of_length(12, seed=3)

    async def main(engine):
        with pytest.raises(ValueError, match="refused w"):
            await tokens(engine, ids, 4, request_id="w", inject_delay_ms={"queue": 60_000})
        return engine.num_waiting, engine.num_running

    assert run(engine, main) == (0, 0)
    error = engine.calls[0][2]
    assert engine.calls == [("drop", "w", error, False), ("deliver", "w", repr(error))]
