"""The server side of a first token, with the engine played by hand: ``deliver`` from the
sampled id to the event loop, ``detokenize``, ``holdback`` while the first text waits for
later tokens (a split UTF-8 character, a possible stop-string prefix, a response sent
whole) and ``deliver`` from the ready text to the start of its send; each begins where the
one before it ends."""

from __future__ import annotations

import asyncio
import json
from itertools import pairwise

import pytest

import ttft.tracer as tt
from ttft.engine.sampler import SamplingParams
from ttft.engine.server.generation import Generation, complete, stream
from ttft.engine.server.metrics import Metrics
from ttft.engine.server.models import Response
from ttft.engine.stream import RequestState, RequestStream
from ttft.engine.tokenizer import Tokenizer
from ttft.tracer.context import new_request_root

RID = "r1"


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    return Tokenizer.load(cache_dir=tmp_path_factory.mktemp("tokenizer"))


def generation(tok: Tokenizer, ids: list[int], stops: list[str]) -> Generation:
    """A generation over a request whose worker already sampled ``ids`` (the last one
    finishes it), the first at the ``first_sampled`` time set now."""
    req = RequestState(
        RID, [1], len(ids), SamplingParams(), {}, new_request_root(RID),
        asyncio.get_running_loop(), asyncio.Queue(),
    )
    req.sampled_ns = tt.clock_ns()
    for i, token in enumerate(ids):
        last = i == len(ids) - 1
        req.queue.put_nowait((token, last, "length" if last else None, 0))
    return Generation(RequestStream(req, tok, lambda: None), stops, Metrics(), req.sampled_ns)


async def answer(app, sent: list[tuple[int, dict]]) -> None:
    """Run the ASGI response ``app``, noting each message with the time its send began."""

    async def send(message):
        sent.append((tt.clock_ns(), message))

    async def receive():
        await asyncio.Event().wait()

    await app({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send)


def run(tok, collect, text: str, stops=(), *, streamed=True, chat=False):
    """Answer ``text``'s tokens; the spans recorded (by name, ``deliver`` by leg) and the
    send time of the first body message that carries text."""
    exporter, tracing = collect

    async def main():
        gen = generation(tok, tok.encode(text), list(stops))
        response = Response(RID, 0, "m", chat)
        sent: list[tuple[int, dict]] = []
        app = stream(gen, response, False) if streamed else await complete(gen, response)
        await answer(app, sent)
        return sent

    sent = asyncio.run(main())
    tracing.flush()
    spans = {}
    for s in exporter.spans:
        name = s.name + (f".{s.attributes['leg']}" if s.name == "deliver" else "")
        spans[name] = s
    bodies = [(t, m["body"]) for t, m in sent if m["type"] == "http.response.body"]
    first_text_ns = next(
        t for t, body in bodies if b'"text":"' in body or b'"content":"' in body
    )
    return spans, first_text_ns, bodies


def assert_chain(spans: dict, names: list[str], first_text_ns: int) -> None:
    chain = [spans[n] for n in names]
    assert [a.end_time - b.start_time for a, b in pairwise(chain)] == [0] * (len(chain) - 1)
    assert spans["deliver.to_send"].end_time <= first_text_ns


def test_text_sent_with_its_token_has_no_holdback(tok, collect):
    spans, first_ns, _ = run(tok, collect, "Hello world again")
    assert "holdback" not in spans
    assert_chain(spans, ["deliver.to_loop", "detokenize", "deliver.to_send"], first_ns)


def test_split_utf8_character_is_held_back_for_the_tokens_that_complete_it(tok, collect):
    ids = tok.encode("€ is money")
    assert tok.decode(ids[:1]).endswith("\ufffd")  # the first token is a piece of "€"
    waited = next(i for i in range(len(ids)) if not tok.decode(ids[: i + 1]).endswith("\ufffd"))
    spans, first_ns, _ = run(tok, collect, "€ is money")
    hold = spans["holdback"]
    assert (hold.attributes["reason"], hold.attributes["waited_tokens"]) == ("utf8", waited)
    assert waited == 2  # the three bytes of "€" are three tokens
    assert_chain(spans, ["deliver.to_loop", "detokenize", "holdback", "deliver.to_send"], first_ns)


def test_possible_stop_string_prefix_is_held_back_until_a_token_rules_it_out(tok, collect):
    # "He", "Hell", "Hello" may each begin "Hello!"; " world" rules it out (3 tokens later)
    assert [tok.decode(tok.encode("Hello world again")[: i + 1]) for i in range(4)] == [
        "He", "Hell", "Hello", "Hello world",
    ]
    spans, first_ns, bodies = run(tok, collect, "Hello world again", ["Hello!"], chat=True)
    hold = spans["holdback"]
    assert (hold.attributes["reason"], hold.attributes["waited_tokens"]) == ("stop_string", 3)
    assert_chain(spans, ["deliver.to_loop", "detokenize", "holdback", "deliver.to_send"], first_ns)
    assert bodies[0][0] < spans["deliver.to_send"].start_time  # the role chunk went before


def test_response_sent_whole_holds_its_first_text_until_the_last_token(tok, collect):
    n = len(tok.encode("Hello world again"))
    spans, first_ns, bodies = run(tok, collect, "Hello world again", streamed=False)
    hold = spans["holdback"]
    assert (hold.attributes["reason"], hold.attributes["waited_tokens"]) == ("not_streamed", n - 1)
    assert_chain(spans, ["deliver.to_loop", "detokenize", "holdback", "deliver.to_send"], first_ns)
    assert json.loads(bodies[0][1])["choices"][0]["text"] == "Hello world again"
