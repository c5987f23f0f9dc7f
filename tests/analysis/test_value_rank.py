"""``_trees.value_rank``: the rank of each code's value among the values present, the same
whether the codes are looked up through a presence table (few values against the codes)
or sorted (many values), whatever order the codes come in."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ttft.analysis._trees import value_rank


def _plain(codes: list[int], values: list[str]) -> list[int]:
    present = sorted({values[c] for c in codes})
    return [present.index(values[c]) for c in codes]


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.text(alphabet="0123456789abcdefABC-", min_size=0, max_size=6),
                    min_size=1, max_size=40, unique=True),
    data=st.data(),
    spare=st.integers(0, 70_000),
)
def test_value_rank_is_the_rank_among_the_values_present(values, data, spare):
    # ``spare`` values nobody names push the table past its bound (4 per code + 65,536),
    # so both ways are drawn.
    names = values + [f"~{i}" for i in range(spare)]
    codes = data.draw(st.lists(st.integers(0, len(values) - 1), min_size=0, max_size=60))
    got = value_rank(np.asarray(codes, np.int64), names)
    assert got.tolist() == _plain(codes, names)


def test_value_rank_keeps_a_2d_shape():
    values = ["c", "a", "b"]
    codes = np.array([[0, 1], [2, 1]])
    assert value_rank(codes, values).tolist() == [[2, 0], [1, 0]]
    assert value_rank(codes, values + [f"z{i}" for i in range(70_000)]).tolist() == [[2, 0], [1, 0]]
