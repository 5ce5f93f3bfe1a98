"""Bitmasks in the shared xgrammar / llguidance / vLLM layout."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import byte_vocabulary
from oracle import bitmask_tokens
from triemask import DEAD, BitmaskError, Compiler, StateError, allocate_token_bitmask, bitmask_width
from triemask.automata.core import ROW_BY_ROW


@pytest.fixture(scope="module")
def automaton():  # type: ignore[no-untyped-def]
    return Compiler(byte_vocabulary()).compile(["get", "get_user", "user", "us", "🦙"])


def test_allocate() -> None:
    bitmask = allocate_token_bitmask(4, 100)
    assert bitmask.shape == (4, 4) and bitmask.dtype == np.int32 and (bitmask == -1).all()
    assert bitmask_width(32) == 1 and bitmask_width(33) == 2
    with pytest.raises(BitmaskError):
        allocate_token_bitmask(2, 0)


def test_layout_bit_i_of_word_i_over_32(automaton) -> None:  # type: ignore[no-untyped-def]
    eos = automaton.eos_token_ids[0]  # 264: word 8, bit 8
    final = automaton.next_state(automaton.next_state(0, 257), eos)
    get = automaton.next_state(0, 257)
    bitmask = allocate_token_bitmask(1, automaton.vocab_size)
    automaton.fill_bitmask(bitmask, [get])
    expected = np.zeros(bitmask.shape[1], dtype=np.uint32)
    for token in (ord("_"), 258, eos):  # "_", "_us", EOS
        expected[token // 32] |= np.uint32(1) << np.uint32(token % 32)
    assert np.array_equal(bitmask[0].view(np.uint32), expected)
    automaton.fill_bitmask(bitmask, [final])
    assert not bitmask.any()


@pytest.mark.parametrize("batch", [1, 3, 4, 5, ROW_BY_ROW, ROW_BY_ROW + 1, 64])  # both paths
def test_batch_fill_equals_rows(automaton, batch: int) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(batch)
    states = rng.integers(DEAD, automaton.num_states, batch)
    bitmask = allocate_token_bitmask(batch + 2, automaton.vocab_size)
    automaton.fill_bitmask(bitmask, states)
    for row, state in enumerate(states):
        assert bitmask_tokens(bitmask[row], automaton.vocab_size) == set(
            automaton.allowed_token_ids(int(state)).tolist()
        )
    assert (bitmask[batch:] == -1).all()
    # explicit rows, in any order, leave the other rows alone
    rows = rng.permutation(batch + 2)[:batch]
    other = allocate_token_bitmask(batch + 2, automaton.vocab_size)
    automaton.fill_bitmask(other, states, rows=rows)
    assert np.array_equal(other[rows], bitmask[:batch])
    untouched = np.setdiff1d(np.arange(batch + 2), rows)
    assert (other[untouched] == -1).all()


@pytest.mark.parametrize("batch", [0, 1, 7, 64])
def test_allowed_token_pairs_equal_the_rows(automaton, batch: int) -> None:  # type: ignore[no-untyped-def]
    states = np.random.default_rng(batch).integers(DEAD, automaton.num_states, batch)
    rows, tokens = automaton.allowed_token_pairs(states)
    assert rows.dtype == np.int64 and tokens.dtype == np.int32 and len(rows) == len(tokens)
    for row, state in enumerate(states.tolist()):
        assert tokens[rows == row].tolist() == automaton.allowed_token_ids(state).tolist()
    assert np.all(np.diff(rows) >= 0)
    with pytest.raises(StateError, match="not a state"):
        automaton.allowed_token_pairs([0, automaton.num_states])
    with pytest.raises(StateError, match="1-D array of integers"):
        automaton.allowed_token_pairs([0.5])


def test_fill_accepts_lists_and_empty_batches(automaton) -> None:  # type: ignore[no-untyped-def]
    bitmask = allocate_token_bitmask(2, automaton.vocab_size)
    automaton.fill_bitmask(bitmask, [])
    automaton.fill_bitmask(bitmask, np.array([], dtype=np.int64), rows=[])
    assert (bitmask == -1).all()
    automaton.fill_bitmask(bitmask, (0, DEAD))
    assert bitmask[0].any() and not bitmask[1].any()


def test_bad_buffers_say_what_is_expected(automaton) -> None:  # type: ignore[no-untyped-def]
    width = bitmask_width(automaton.vocab_size)
    good = allocate_token_bitmask(2, automaton.vocab_size)
    expected = rf"expected an int32 array of shape \(batch, {width}\)"
    with pytest.raises(BitmaskError, match=expected + ".*got dtype int64"):
        automaton.fill_bitmask(good.astype(np.int64), [0])
    with pytest.raises(BitmaskError, match=expected + r".*shape \(2, 4\)"):
        automaton.fill_bitmask(np.zeros((2, 4), np.int32), [0])
    with pytest.raises(BitmaskError, match="not C-contiguous"):
        automaton.fill_bitmask(np.zeros((width, 2), np.int32).T, [0])
    read_only = good.copy()
    read_only.flags.writeable = False
    with pytest.raises(BitmaskError, match="read-only"):
        automaton.fill_bitmask(read_only, [0])
    with pytest.raises(BitmaskError, match=r"got builtins\.list"):
        automaton.fill_bitmask([[0] * width], [0])
    with pytest.raises(StateError, match="3 states but the bitmask has only 2 rows"):
        automaton.fill_bitmask(good, [0, 0, 0])
    with pytest.raises(StateError, match="9 states but the bitmask has only 2 rows"):
        automaton.fill_bitmask(good, [0] * 9)
    with pytest.raises(StateError, match=r"rows must lie in \[0, 2\)"):
        automaton.fill_bitmask(good, [0], rows=[2])
    with pytest.raises(StateError, match="rows must be 1 integers"):
        automaton.fill_bitmask(good, [0], rows=[0, 1])
    with pytest.raises(StateError, match="state 1000 is not a state"):
        automaton.fill_bitmask(good, [0, 1000])
    assert (good == -1).all()  # nothing is written when a state is invalid
    with pytest.raises(StateError, match=r"rows must be integers, got float 0\.0"):
        automaton.fill_bitmask(good, [0], rows=[0.0])
    for states in ([1.0], np.array([0.5]), [0, 1.0], [0] * ROW_BY_ROW + [1.0]):  # floats are not truncated
        with pytest.raises(StateError, match="integers"):
            automaton.fill_bitmask(allocate_token_bitmask(len(states), automaton.vocab_size), states)
    big = allocate_token_bitmask(8, automaton.vocab_size)
    for count in (2, 6):  # the row-by-row path and the vectorised one
        with pytest.raises(StateError, match="rows must be distinct"):
            automaton.fill_bitmask(big, [0] * count, rows=[1] * count)


class _FakeTensor:
    """Stands in for a torch tensor: triemask recognises tensors by module."""

    __module__ = "torch"

    def __init__(self, array: np.ndarray, device: str = "cpu") -> None:
        self._array, self.device, self.dtype, self.shape = array, device, f"torch.{array.dtype}", array.shape

    def is_contiguous(self) -> bool:
        return bool(self._array.flags.c_contiguous)

    def numpy(self) -> np.ndarray:
        return self._array


def test_torch_like_buffers(automaton) -> None:  # type: ignore[no-untyped-def]
    array = allocate_token_bitmask(1, automaton.vocab_size)
    automaton.fill_bitmask(_FakeTensor(array), [0])
    assert bitmask_tokens(array[0], automaton.vocab_size) == set(automaton.allowed_token_ids(0).tolist())
    with pytest.raises(BitmaskError, match="torch tensor on cuda:0"):
        automaton.fill_bitmask(_FakeTensor(array, "cuda:0"), [0])
    with pytest.raises(BitmaskError, match=r"dtype torch\.int64"):
        automaton.fill_bitmask(_FakeTensor(array.astype(np.int64)), [0])
