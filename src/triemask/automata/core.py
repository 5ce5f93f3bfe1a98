"""What every automaton kind shares: states, the C-or-Python per-step base, bit helpers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..base import StateError, as_bitmask_array, integer, kernels

DEAD = -1
"""The state a rejected token leads to. Nothing is allowed in it."""

IntArray = npt.NDArray[np.integer[Any]]


def state_index(state: Any, what: str = "states") -> int:
    """``state`` as an int; floats, bools and other non-integers are rejected, not truncated."""
    return state if type(state) is int else integer(state, what)


def count_states(states: Any) -> int:
    """How many states a batch holds; a batch that is no sequence is a StateError."""
    try:
        return len(states)
    except TypeError:
        raise StateError(f"states must be a sequence of integers, got {type(states).__name__} {states!r:.40}") from None


def as_int64(values: Any) -> Any:
    """What the kernel reads: lists and tuples as they are, signed integer arrays as int64
    (anything else goes unchanged, and the kernel defers it to the reference)."""
    if type(values) is np.ndarray and values.dtype.kind == "i" and values.dtype != np.int64:
        return values.astype(np.int64)
    return values


# An automaton's kernel's batch calls (the kernel may be None), each None / False where the C
# side defers to the reference (the arguments need its checks).


def kernel_pairs(kernel: Any, states: Any) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]] | None:
    pairs = kernel.pairs(as_int64(states)) if kernel is not None else None
    if pairs is None:
        return None
    return np.frombuffer(pairs[0], dtype=np.int64), np.frombuffer(pairs[1], dtype=np.int32)


def kernel_next_states(kernel: Any, states: Any, token_ids: Any) -> npt.NDArray[np.int32] | None:
    if kernel is None:
        return None
    out = np.empty(count_states(states), dtype=np.int32)
    return out if kernel.next_batch(as_int64(states), as_int64(token_ids), out) else None


def kernel_fill(kernel: Any, bitmask: Any, states: Any, rows: Any, vocab_size: int) -> bool:
    if kernel is None:
        return False
    # a CPU torch tensor: its numpy view (as_bitmask_array raises for a wrong one)
    target = bitmask if type(bitmask) is np.ndarray else as_bitmask_array(bitmask, vocab_size)
    if rows is None and type(states) in (list, tuple) and len(states) == 1:
        return bool(kernel.fill(target, 0, states[0]))  # the per-step path
    return bool(kernel.fill_batch(target, as_int64(states), None if rows is None else as_int64(rows)))


def set_bits(target: npt.NDArray[np.int32], positions: npt.NDArray[Any], tokens: npt.NDArray[np.int32]) -> None:
    """Set bit ``token % 32`` of ``target[position]`` for each pair: the bitmask of tokens
    sorted within each row (equal positions adjacent), one OR per word, then one scatter."""
    if not len(tokens):
        return
    bits = np.left_shift(np.uint32(1), (tokens & 31).astype(np.uint32))
    starts = np.flatnonzero(np.concatenate(([True], positions[1:] != positions[:-1])))
    target[positions[starts]] = np.bitwise_or.reduceat(bits, starts).view(np.int32)


def count_words(tokens: npt.NDArray[np.int32], offsets: npt.NDArray[np.int32]) -> int:
    """How many bitmask words of all nodes are non-zero (nodes' tokens sorted)."""
    word = tokens.astype(np.int64) >> 5
    new = np.ones(len(word), dtype=bool)
    new[1:] = word[1:] != word[:-1]
    new[offsets[offsets < len(word)]] = True  # a node starts a new word
    return int(np.count_nonzero(new))


def dense_threshold(width: int) -> int:
    """How many allowed tokens make a node's bitmask row stored whole (``width`` words):
    half a row's worth, so a stored row takes at most the memory of its node's edges,
    and a step at a node allowing most of the vocabulary is one copy, not one bit per token."""
    return max(1, width // 2)


def dense_rows(
    tokens: npt.NDArray[np.int32],
    offsets: npt.NDArray[np.int32],
    num_nodes: int,
    width: int,
    nodes: npt.NDArray[np.int32] | None = None,
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """The nodes (ascending) whose rows are stored whole, and those rows, flat. ``nodes``: the
    nodes as a file stored them (saves a pass over every node's offsets when loading; any
    ascending nodes give the same masks, since each row is built from the node's edges)."""
    if nodes is None:
        counts = np.diff(offsets[: num_nodes + 1])
        nodes = np.flatnonzero(counts >= dense_threshold(width)).astype(np.int32)
    elif nodes.dtype != np.int32 or nodes.ndim != 1:
        raise ValueError(f"dense nodes are {nodes.dtype} of shape {nodes.shape}, not a 1-D int32 array")
    elif len(nodes) and (int(nodes[0]) < 0 or int(nodes[-1]) >= num_nodes or (np.diff(nodes) <= 0).any()):
        raise ValueError("dense nodes are not ascending nodes of the trie")
    rows = np.zeros((len(nodes), width), dtype=np.int32)
    for row, node in zip(rows, nodes.tolist(), strict=True):
        allowed = tokens[offsets[node] : offsets[node + 1]]
        set_bits(row, allowed >> 5, allowed)
    return nodes, rows.reshape(-1)


ROW_BY_ROW = 24  # fill_bitmask and next_states handle batches up to this size row by row (measured)


class _AutomatonCore:
    """TrieAutomaton's per-step methods in Python. With the C extension,
    ``triemask.base._native.AutomatonCore`` takes its place: the same methods in C (a Python
    call per step less), deferring to the ``_reference`` methods for what it does not take."""

    __slots__ = ("_kernel",)
    _kernel: Any

    def next_state(self, state: int, token_id: int) -> int:
        """The state after ``token_id``; :data:`DEAD` when the token is not allowed."""
        return self._next_state_reference(state, token_id)

    def fill_bitmask(
        self, bitmask: Any, states: Sequence[int] | npt.NDArray[np.integer[Any]], *, rows: npt.ArrayLike | None = None
    ) -> None:
        """Write the allowed-token masks of a batch of states into ``bitmask``, in place.

        Parameters
        ----------
        bitmask : numpy array or CPU torch tensor
            ``int32`` of shape ``(batch, ceil(vocab_size / 32))``, C-contiguous; bit
            ``i % 32`` of word ``i // 32`` is set iff token ``i`` is allowed. Every
            written row is overwritten entirely.
        states : sequence of int
            One state per row to write.
        rows : sequence of int, optional
            The rows to write, one per state (distinct); default ``0 .. len(states) - 1``.
        """
        self._fill_bitmask_reference(bitmask, states, rows=rows)

    def _next_state_reference(self, state: int, token_id: int) -> int:
        raise NotImplementedError

    def _fill_bitmask_reference(
        self, bitmask: Any, states: Sequence[int] | npt.NDArray[np.integer[Any]], *, rows: npt.ArrayLike | None = None
    ) -> None:
        raise NotImplementedError


if TYPE_CHECKING or kernels.KERNELS is None:  # noqa: SIM108 (type checkers see the Python class)
    AutomatonBase = _AutomatonCore
else:
    AutomatonBase = kernels.KERNELS.AutomatonCore


@dataclass(frozen=True)
class AutomatonMeta:
    """What every automaton kind carries besides its arrays: the vocabulary it was compiled
    for, EOS, the values' type and the compile's record. A file stores it as JSON fields
    (:meth:`to_file`, the same keys since the first format)."""

    vocab_size: int
    vocab_fingerprint: str
    eos_token_ids: tuple[int, ...]
    eos: bool
    values_are_str: bool
    input_values: int
    compile_seconds: float

    def to_file(self) -> dict[str, Any]:
        """The JSON fields of a file."""
        return {
            "values_are_str": self.values_are_str,
            "input_values": self.input_values,
            "vocab_size": self.vocab_size,
            "vocab_fingerprint": self.vocab_fingerprint,
            "eos_token_ids": list(self.eos_token_ids),
            "eos": self.eos,
            "compile_seconds": self.compile_seconds,
        }

    @classmethod
    def from_file(cls, meta: dict[str, Any]) -> AutomatonMeta:
        """The metadata of a file's fields (checked by the loader before)."""
        return cls(
            vocab_size=meta["vocab_size"],
            vocab_fingerprint=meta["vocab_fingerprint"],
            eos_token_ids=tuple(meta["eos_token_ids"]),
            eos=meta["eos"],
            values_are_str=meta["values_are_str"],
            input_values=meta["input_values"],
            compile_seconds=meta["compile_seconds"],
        )
