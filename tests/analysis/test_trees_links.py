"""Parent resolution (`_trees._links`): the pairwise path for narrow blocks and the sorting
path give the same parents, copies kept and orphans, on random blocks with missing ids,
self-parents, orphans and repeated ids."""

import numpy as np
import pytest

import ttft.analysis._trees as trees


def block(seed: int, n: int, k: int, repeated: bool):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 4 if repeated else 2**62, (n, k, 2)).astype(np.uint64)
    hi, lo = ids[..., 0], ids[..., 1]
    has = rng.random((n, k)) > 0.05
    pick = rng.integers(0, k, (n, k))
    phi, plo = np.take_along_axis(hi, pick, 1), np.take_along_axis(lo, pick, 1)
    phi[:, 0] = rng.integers(0, 2**62, n).astype(np.uint64)  # an orphan per request
    has_parent = rng.random((n, k)) < 0.9
    key = (plo, phi, has_parent, rng.random((n, k)) < 0.5,
           rng.integers(0, 3, (n, k)).astype(np.int8), rng.integers(0, 4, (n, k)),
           rng.integers(0, 4, (n, k)))
    # Two traces per request, parents mostly asked in the span's own trace.
    tr = rng.integers(0, 2, (n, k)).astype(np.int32)
    ptr = np.where(rng.random((n, k)) < 0.8, tr, 1 - tr).astype(np.int32)
    return hi, lo, tr, has, phi, plo, ptr, has_parent, key


@pytest.mark.parametrize("k", [1, 2, 7, 24, 64])
@pytest.mark.parametrize("repeated", [False, True])
def test_pairwise_and_sorting_paths_agree(monkeypatch, k, repeated):
    for seed in range(3):
        args = block(seed, 300, k, repeated)
        fast = trees._links(*args)
        monkeypatch.setattr(trees, "_SMALL_BLOCK", 0)  # every block through the sorts
        sorted_ = trees._links(*args)
        monkeypatch.undo()
        for a, b in zip(fast, sorted_, strict=True):
            np.testing.assert_array_equal(a, b)


def _walked_depths(parent: np.ndarray) -> np.ndarray:
    """Ancestors by walking up one span at a time, at most K hops (a cycle's spans: K)."""
    n, k = parent.shape
    out = np.zeros((n, k), np.int64)
    for r in range(n):
        for c in range(k):
            at, hops = int(parent[r, c]), 0
            while at >= 0 and hops < k:
                at, hops = int(parent[r, at]), hops + 1
            out[r, c] = hops
    return out


@pytest.mark.parametrize("seed", range(40))
def test_depths_by_doubling_equal_a_walk_up(seed):
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(1, 8)), int(rng.integers(1, 40))
    if seed % 2:  # any graph: self-parents and cycles included
        parent = rng.integers(-1, k, (n, k))
    else:  # a forest: parents in earlier columns, some deep chains
        cols = np.arange(k)[None]
        earlier = np.maximum(cols - rng.integers(1, 3, (n, k)), -1)
        parent = np.where(rng.random((n, k)) < 0.9, earlier, -1)
    assert trees._depths(parent).tolist() == _walked_depths(parent).tolist()


def _renamed(rows, names):
    return [{**r, "span_id": names.get(r["span_id"], r["span_id"]),
             "parent_id": names.get(r["parent_id"], r["parent_id"])} for r in rows]


def test_trees_of_other_id_forms_equal_those_of_hex_ids():
    """Span ids of any form (an importer's, a user's table) give the parents that the same
    spans with W3C hex ids give: the span and parent columns are ranked together."""
    from _build import event, row, sid, table

    from ttft.analysis.assemble import assemble
    from ttft.analysis.attribution import attribute

    rows = [row(1, 1, "client", 0, 1000, stage="client", clock="client"),
            event(1, 5, "first_token", 1000, parent=1, clock="client"),
            row(1, 2, "server", 100, 900, parent=1, stage="server"),
            row(1, 3, "tokenize", 200, 300, parent=2, stage="tokenize"),
            row(1, 4, "queue", 300, 700, parent=2, stage="queue"),
            event(1, 6, "first_byte", 900, parent=2)]
    names = {sid(1): "x", sid(2): "b", sid(3): "c", sid(4): "a-long-id", sid(5): "e",
             sid(6): "f"}
    hex_asm, other_asm = assemble(table(rows)), assemble(table(_renamed(rows, names)))
    assert hex_asm.spans.parent.tolist() == [-1, 0, 1, 1]
    assert other_asm.spans.parent.tolist() == hex_asm.spans.parent.tolist()
    assert other_asm.spans.depth.tolist() == [0, 1, 2, 2]
    for policy in ("exclusive", "critical-path"):
        hex_att, other_att = (attribute(a, "client", policy) for a in (hex_asm, other_asm))
        assert hex_att.attributed.equals(other_att.attributed)
        assert hex_att.attributed.loc[0, "tokenize"] == 100
        assert hex_att.covered.equals(other_att.covered)


@pytest.mark.parametrize("k", [1, 3, 24])
def test_parents_are_the_span_of_that_id_in_the_asked_trace(k):
    """Against a brute-force search: a span's parent is the other span whose (trace, id)
    is the (trace, parent id) it asks for; ids unique per (trace, id) in each request."""
    for seed in range(3):
        hi, lo, tr, has, phi, plo, ptr, has_parent, key = block(seed, 200, k, False)
        parent, keep, found = trees._links(hi, lo, tr, has, phi, plo, ptr, has_parent, key)
        assert keep.all()
        for r in range(hi.shape[0]):
            for c in range(k):
                want = [j for j in range(k) if j != c and has[r, j] and has_parent[r, c]
                        and (tr[r, j], hi[r, j], lo[r, j]) == (ptr[r, c], phi[r, c], plo[r, c])]
                assert parent[r, c] == (want[0] if want else -1)


def _parts(rows, boundary):
    from _build import table

    from ttft.analysis.assemble import assemble
    from ttft.analysis.attribution import attribute

    asm = assemble(table(rows))
    result = attribute(asm, boundary, "exclusive")
    return asm.quality.counts["duplicate_span_id"], result.attributed.to_dict("records")


def test_an_engine_gpu_span_may_reuse_an_id_of_the_request_trace():
    """Span ids are unique per trace: the gpu span of an engine trace joined into a request
    whose own trace has a span of the same id is neither a duplicate nor changes a part."""
    from _build import event, row

    def build(gpu_span):
        return [row(1, 1, "server", 0, 100), row(1, 2, "queue", 0, 10, parent=1),
                row(1, 3, "prefill.chunk", 10, 60, parent=1, step_id=7),
                row(1, 4, "sample", 60, 70, parent=1), event(1, 5, "first_byte", 80, parent=1),
                row(2, 1, "step", 5, 65), row(2, gpu_span, "gpu", 20, 65, parent=1, step_id=7)]

    want = _parts(build(99), "server")
    assert want[0] == 0 and want[1][0]["gpu"] == 45
    for reused in (2, 3, 4):
        assert _parts(build(reused), "server") == want


def test_a_request_of_two_traces_may_reuse_span_ids_across_them():
    """A client trace and a server trace joined by request id (context lost) whose span ids
    overlap: no duplicates, the same parts as with distinct ids."""
    from _build import event, row

    def build(base):
        client = {"clock": "client", "service": "loadgen"}
        return [row(1, 1, "client", 0, 200, request_id="r1", **client),
                row(1, 2, "connect", 0, 5, parent=1, **client),
                event(1, 3, "first_token", 150, parent=1, **client),
                row(2, base, "server", 10, 190, request_id="r1"),
                row(2, base + 1, "tokenize", 12, 20, parent=base, request_id="r1"),
                row(2, base + 2, "queue", 20, 40, parent=base, request_id="r1"),
                event(2, base + 3, "first_byte", 120, parent=base, request_id="r1")]

    for boundary in ("client", "server"):
        want = _parts(build(100), boundary)
        assert want[0] == 0 and want[1][0]["queue"] == 20
        assert _parts(build(1), boundary) == want


@pytest.mark.parametrize("hex_ids", [True, False])
def test_empty_ids_mean_none_as_nulls_do(hex_ids):
    """An empty ``span_id``, ``parent_id``, ``request_id`` or ``trace_id`` names nothing:
    the assembly, defects and parts equal those of the same table with nulls there."""
    from _build import event, row, table

    from ttft.analysis.assemble import assemble
    from ttft.analysis.attribution import attribute

    rows = [row(1, 1, "server", 0, 100), row(1, 2, "queue", 0, 10, parent=1),
            row(1, None, "tokenize", 10, 20, parent=1),
            row(1, None, "prefill", 20, 60, parent=1),  # two spans without ids: no duplicate
            row(1, 5, "sample", 60, 70),  # no parent id: a child of the root, no defect
            event(1, 6, "first_byte", 80, parent=1),
            row(2, 1, "server", 0, 50), event(2, 2, "first_byte", 40, parent=1),
            row(3, 1, "server", 0, 60), event(3, 2, "first_byte", 30, parent=1),
            row(4, 1, "server", 0, 60)]
    rows[-1]["trace_id"] = None  # a row without a trace
    if not hex_ids:
        for r in rows:
            for key in ("span_id", "parent_id"):
                if r[key] is not None:
                    r[key] = f"s-{int(r[key], 16)}"
    blank = [dict(r) for r in rows]
    for r in blank:
        for key in ("span_id", "parent_id", "request_id", "trace_id"):
            if r[key] is None:
                r[key] = ""
    want, got = assemble(table(rows)), assemble(table(blank))
    assert len(got.requests) == len(want.requests) == 3  # "" request ids join nothing
    assert got.quality.counts == want.quality.counts
    assert got.quality.counts["duplicate_span_id"] == 0
    assert got.quality.counts["orphan_parent"] == 0
    assert got.quality.counts["missing_field"] == 1
    assert got.spans.parent.tolist() == want.spans.parent.tolist()
    w, g = attribute(want, "server", "exclusive"), attribute(got, "server", "exclusive")
    assert g.attributed.equals(w.attributed)
    assert g.attributed.loc[0, "prefill"] == 40


@pytest.mark.parametrize("width", [16, 6])
def test_hex_ids_match_whatever_their_case_and_other_ids_keep_theirs(width):
    """OTLP's JSON form writes hex ids in either case: a trace or span id written in
    upper case in some rows and lower case in others is one trace, one span (16-character
    ids take the words path, others the ranked one). Ids that are not hex keep their
    case: ``S-a`` and ``s-A`` are two spans."""
    from _build import event, row, table

    from ttft.analysis.assemble import assemble
    from ttft.analysis.attribution import attribute

    def build():
        t = 0xFACE  # a trace id with letters
        return [row(t, 1, "server", 0, 100), row(t, 0xAB, "queue", 0, 10, parent=1),
                row(t, 3, "prefill", 10, 60, parent=0xAB),
                row(t, 4, "sample", 60, 70, parent=1), event(t, 5, "first_byte", 80, parent=1)]

    def shorten(rows):
        for r in rows:
            for key in ("span_id", "parent_id"):
                if r[key] is not None:
                    r[key] = r[key][-width:]
        return rows

    want = assemble(table(shorten(build())))
    mixed = shorten(build())
    mixed[1]["span_id"] = mixed[1]["span_id"].upper()  # the queue span: ...AB
    for r in mixed[2:]:
        r["trace_id"] = r["trace_id"].upper()
    got = assemble(table(mixed))
    assert len(got.requests) == 1
    assert got.quality.counts == want.quality.counts
    assert got.spans.parent.tolist() == want.spans.parent.tolist()
    assert attribute(got, "server", "exclusive").attributed.equals(
        attribute(want, "server", "exclusive").attributed)

    other = shorten(build())
    other[1]["span_id"] = "S-a"
    other[2]["parent_id"] = "s-A"  # not the queue span: an orphan, a child of the root
    got = assemble(table(other))
    assert got.quality.counts["orphan_parent"] == 1


@pytest.mark.parametrize("later_ns", [1_000_000, 30])
def test_a_reused_step_id_joins_the_engine_trace_nearest_in_time(later_ns):
    """An engine restarted (or two replicas sharing a service name) counts steps from 0
    again: each chunk joins the gpu span of the step trace nearest its own start, so the
    parts equal those of each run analysed alone, and the reuse is counted."""
    from _build import event, row, table

    from ttft.analysis.assemble import assemble
    from ttft.analysis.attribution import attribute

    def run(trace: int, engine: int, t0: int, gpu_ns: int) -> list[dict]:
        return [row(trace, 1, "server", t0, t0 + 100),
                row(trace, 2, "queue", t0, t0 + 10, parent=1),
                row(trace, 3, "prefill.chunk", t0 + 10, t0 + 60, parent=1, step_id=7),
                row(trace, 4, "sample", t0 + 60, t0 + 70, parent=1),
                event(trace, 5, "first_byte", t0 + 80, parent=1),
                row(engine, 1, "step", t0 + 5, t0 + 65),
                row(engine, 2, "gpu", t0 + 15, t0 + 15 + gpu_ns, parent=1, step_id=7)]

    # A restart (the second run much later) or a replica (overlapping the first).
    first, second = run(1, 2, 0, 40), run(3, 4, later_ns, 20)
    alone = [attribute(assemble(table(r)), "server", "exclusive").attributed.loc[0, "gpu"]
             for r in (first, second)]
    assert alone == [40, 20]
    for rows in (first + second, second + first):
        asm = assemble(table(rows))
        got = attribute(asm, "server", "exclusive")
        by_trace = dict(zip(got.requests["trace_id"], got.attributed["gpu"], strict=True))
        assert [by_trace[tid] for tid in sorted(by_trace)] == alone
        assert asm.quality.counts["reused_step_id"] == 2
        assert len(asm.spans.req) == 2 * 5  # one gpu copy per request, not two


def _answers(rows, policy):
    """The distinct (nonzero) parts of request 0 over every order of ``rows``."""
    import itertools

    from _build import table

    from ttft.analysis.assemble import assemble
    from ttft.analysis.attribution import attribute

    seen = set()
    for perm in itertools.permutations(range(len(rows))):
        got = attribute(assemble(table([rows[i] for i in perm])), "server", policy)
        seen.add(tuple(sorted((k, int(v)) for k, v in got.attributed.iloc[0].items() if v)))
    return seen


def test_one_span_id_in_two_traces_of_a_request_is_ordered_by_stage_then_trace():
    """Found by an adversarial run: spans of one id in two traces of a request (joined by
    request id) that tie on every other key were ordered by column, so row order chose the
    exclusive winner, the shared remainder and the critical path's child."""
    from _build import event, row

    tie = [row(1, 2, "server", 0, 1000, request_id="r"), event(1, 3, "first_byte", 1000, parent=2),
           row(1, 5, "tokenize", 100, 500, request_id="r"),
           row(2, 5, "detokenize", 100, 401, request_id="r")]
    # tokenize and detokenize share a priority: the stage name decides, as in the reference
    assert _answers(tie, "exclusive") == {(("server", 600), ("tokenize", 400))}
    assert _answers(tie, "shared") == {(("detokenize", 150), ("server", 600), ("tokenize", 250))}
    siblings = [row(1, 1, "server", 0, 1000, request_id="r"),
                event(1, 9, "first_byte", 1000, parent=1),
                row(1, 5, "prefill", 100, 500, parent=1, request_id="r"),
                row(1, 6, "sample", 300, 500, parent=5, request_id="r"),
                row(2, 5, "prefill", 100, 500, request_id="r"),
                row(2, 7, "prefill.chunk", 300, 500, parent=5, request_id="r")]
    assert len(_answers(siblings, "critical-path")) == 1


def test_the_copy_kept_of_a_gpu_span_joined_twice_never_depends_on_row_order():
    """A gpu span joined through two chunks of one span id, in two traces of one request
    (one under the server, one under tokenize): its copies differ only in the trace their
    parent is found in. The one kept is the one whose parent's trace id is smaller, in
    any order of the rows (before: the first in row order, so its depth was 2 or 3)."""
    from _build import event, row, table

    from ttft.analysis.assemble import assemble

    rows = [
        row(1, 1, "server", 0, 1000, request_id="r0"),
        row(1, 5, "prefill.chunk", 100, 600, parent=1, step_id=7),
        event(1, 6, "first_byte", 900, parent=1),
        row(2, 2, "server", 0, 1000, request_id="r0"),
        row(2, 3, "tokenize", 50, 700, parent=2),
        row(2, 5, "prefill.chunk", 100, 600, parent=3, step_id=7),
        row(100, 9, "gpu", 150, 650, step_id=7, clock="gpu:0"),
    ]
    rng = np.random.default_rng(0)
    orders = [np.arange(len(rows)), np.arange(len(rows))[::-1],
              *(rng.permutation(len(rows)) for _ in range(30))]
    seen = set()
    for order in orders:
        sp = assemble(table([rows[i] for i in order])).spans
        kept = np.flatnonzero((sp.stage == trees.CODE["gpu"]) & sp.keep)
        assert len(kept) == 1 and (sp.stage == trees.CODE["gpu"]).sum() == 2
        (g,) = kept
        parent = sp.offsets[sp.req[g]] + sp.parent[g]
        seen.add((int(sp.depth[g]), sp.trace_values[sp.trace[parent]]))
    assert seen == {(2, "00000000000000000000000000000001")}


@pytest.mark.parametrize("with_steps", [True, False])
def test_a_step_id_reused_within_one_engine_trace_joins_its_own_step(with_steps):
    """One engine trace numbering its steps 0, 1, 0, 1 (per batch, or a counter restarted
    without a new trace): each chunk joins the gpu span of its own step, told apart by the
    engine's step spans, or without them by the other step's work between the two; each
    request keeps its own gpu time, never a neighbour's, and the reuse is counted."""
    from _build import event, row, table

    from ttft.analysis.assemble import assemble
    from ttft.analysis.attribution import attribute

    engine, rows, own = 99, [], []
    for i in range(4):
        t0, gpu_ns = 1_000 * i, 100 + 10 * i  # requests overlap their neighbours
        rows += [row(i + 1, 1, "server", t0, t0 + 1_500),
                 row(i + 1, 2, "prefill.chunk", t0 + 10, t0 + 600, parent=1, step_id=i % 2),
                 event(i + 1, 3, "first_byte", t0 + 1_400, parent=1),
                 row(engine, 10 + i, "gpu", t0 + 20, t0 + 20 + gpu_ns,
                     parent=20 + i if with_steps else None, step_id=i % 2)]
        if with_steps:
            rows.append(row(engine, 20 + i, "step", t0 + 5, t0 + 650, step_id=i % 2))
        own.append(gpu_ns)
    asm = assemble(table(rows))
    got = attribute(asm, "server", "exclusive")
    by_trace = dict(zip(got.requests["trace_id"], got.attributed["gpu"], strict=True))
    assert [by_trace[t] for t in sorted(by_trace)] == own
    assert asm.quality.counts["reused_step_id"] == 4
    assert len(asm.rows.gpu_row) == 4  # one gpu copy per chunk, not two


def test_a_step_id_used_once_joins_every_gpu_span_of_its_step():
    """Not a reuse: a step's gpu spans on two devices (two clocks) and two chunks of the
    batch join all of them, and nothing is counted."""
    from _build import event, row, table

    from ttft.analysis.assemble import assemble

    rows = []
    for i in range(2):
        rows += [row(i + 1, 1, "server", 0, 1_000),
                 row(i + 1, 2, "prefill.chunk", 10 + 100 * i, 100 + 100 * i, parent=1,
                     step_id=5),
                 event(i + 1, 3, "first_byte", 900, parent=1)]
    rows += [row(9, 1, "step", 0, 400, step_id=5),
             row(9, 2, "gpu", 20, 300, parent=1, step_id=5, clock="gpu:0"),
             row(9, 3, "gpu", 25, 310, parent=1, step_id=5, clock="gpu:1")]
    asm = assemble(table(rows))
    assert len(asm.rows.gpu_row) == 4
    assert asm.quality.counts.get("reused_step_id", 0) == 0


@pytest.mark.parametrize("policy", ["exclusive", "shared", "critical-path"])
def test_chunks_run_one_forward_each_keep_their_own_gpu_time(policy):
    """ttft's own engine runs a step's chunks one after the other, one forward each: the
    forward (in the engine trace, under the step) launches its gpu work inside its chunk,
    and the work may run on after the chunk ends. Each chunk joins the gpu spans it
    launched, so the request whose chunk runs second waits for the first one's gpu work
    in its batch_wait (a neighbour's prefill), not as gpu time of its own."""
    from _build import event, row, table

    from ttft.analysis.assemble import assemble
    from ttft.analysis.attribution import attribute

    rows = [row(9, 1, "step", 0, 400, step_id=7)]
    # (batch_wait, chunk, forward, gpu) of request A, then B; B waits while A's chunk runs.
    for t, (bw, c, f, g) in enumerate([((5, 10), (10, 100), (15, 60), (20, 150)),
                                       ((5, 100), (100, 200), (105, 150), (150, 260))], 1):
        rows += [row(t, 1, "server", 0, 400), row(t, 2, "batch_wait", *bw, parent=1),
                 row(t, 3, "prefill.chunk", *c, parent=1, step_id=7),
                 row(t, 4, "sample", 300, 310, parent=1),
                 event(t, 5, "first_byte", 350, parent=1),
                 row(9, 10 * t, "forward", *f, parent=1),
                 row(9, 10 * t + 1, "gpu", *g, parent=10 * t, step_id=7, clock="gpu:0")]
    asm = assemble(table(rows))
    assert len(asm.rows.gpu_row) == 2  # one copy each, not the step's two
    got = attribute(asm, "server", policy).attributed
    assert got.loc[1, "batch_wait"] > 0  # B's wait for A's chunk is a wait
    assert got.loc[0, "gpu"] <= 130 and got.loc[1, "gpu"] <= 110  # at most their own
    assert got.loc[0, "gpu"] > 0 and got.loc[1, "gpu"] > 0


def test_one_forward_for_the_batch_joins_every_chunk():
    """An engine that runs one forward for the whole batch launches it before (or outside)
    the chunks' spans: every chunk of the step joins its gpu work, as before."""
    from _build import event, row, table

    from ttft.analysis.assemble import assemble

    rows = [row(9, 1, "step", 0, 400, step_id=3), row(9, 2, "forward", 0, 50, parent=1),
            row(9, 3, "gpu", 55, 250, parent=2, step_id=3, clock="gpu:0")]
    for t in (1, 2):
        rows += [row(t, 1, "server", 0, 400),
                 row(t, 2, "prefill.chunk", 50 + t, 250, parent=1, step_id=3),
                 event(t, 3, "first_byte", 350, parent=1)]
    asm = assemble(table(rows))
    assert len(asm.rows.gpu_row) == 2  # the one gpu span, copied into both requests
