"""The array-only trie builder, on both sorting paths."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from triemask.base import trie as _trie
from triemask.base.trie import build_trie


def _pack(values: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    starts = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum([len(v) for v in values], out=starts[1:])
    return np.frombuffer(b"".join(values), dtype=np.uint8), starts


def _check(values: list[bytes]) -> None:
    trie = build_trie(*_pack(values), return_inverse=True)
    spelled = [b""] * trie.num_nodes
    for node in range(1, trie.num_nodes):
        assert trie.parent[node] < node
        spelled[node] = spelled[trie.parent[node]] + bytes([trie.byte[node]])
    prefixes = {v[:i] for v in values for i in range(len(v) + 1)}
    assert sorted(spelled) == sorted(prefixes)  # one node per distinct prefix
    assert spelled == sorted(spelled, key=lambda s: (len(s), s))  # breadth-first, lexicographic per depth
    assert np.all(np.diff(trie.parent) >= 0)  # parents never decrease
    unique = sorted(set(values))
    assert [trie.string(i) for i in range(trie.num_strings)] == unique
    assert [spelled[t] for t in trie.terminal] == unique
    assert trie.inverse is not None and [unique[i] for i in trie.inverse] == values
    for depth in range(len(trie.level_offsets) - 1):
        level = spelled[trie.level_offsets[depth] : trie.level_offsets[depth + 1]]
        assert all(len(s) == depth for s in level)


@pytest.mark.parametrize("matrix_cells", [_trie._MAX_MATRIX_CELLS, 0])  # numpy and Python sorting
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.binary(max_size=7).map(lambda b: bytes(x % 5 * 60 for x in b)), min_size=1, max_size=10))
def test_trie_is_exactly_the_prefix_set(
    values: list[bytes], matrix_cells: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_trie, "_MAX_MATRIX_CELLS", matrix_cells)
    _check(values)


def test_edge_cases() -> None:
    _check([b""])
    _check([b"", b""])
    _check([b"\x00", b"\x00\x00", b"\x00\x01"])  # NUL bytes, which numpy strings would drop
    _check([b"abc", b"ab", b"a", b"b"])
    _check([bytes([b]) for b in range(256)])
    _check([b"x" * 300, b"y"])  # ragged lengths take the Python path
