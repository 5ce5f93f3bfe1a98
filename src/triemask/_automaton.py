"""The compiled automaton: flat arrays, integer states, stateless lookups."""

from __future__ import annotations

import hashlib
import os
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

import numpy as np
import numpy.typing as npt

from . import _kernels, _storage
from ._bitmask import INT32, as_bitmask_array, bitmask_width
from ._errors import ArgumentTypeError, AutomatonFileError, StateError, ValueIndexError, ValueSetError, integer
from ._trie import build_trie

__all__ = [
    "DEAD",
    "DagAutomaton",
    "TrieAutomaton",
    "dense_threshold",
    "expect_dtype",
    "expect_within",
    "first_misspelled_edge",
    "native_kernel",
    "register_kind",
    "restore_parts",
    "restore_stored",
    "set_bits",
    "set_fingerprint",
    "state_index",
    "utf8_steps",
]

DEAD = -1
"""The state a rejected token leads to. Nothing is allowed in it."""

_IntArray = npt.NDArray[np.integer[Any]]


def set_fingerprint(flat: npt.NDArray[np.uint8], starts: npt.NDArray[Any], are_str: bool) -> str:
    """The fingerprint of a set of values from its distinct values in sorted order
    (concatenated, with their offsets): the same set in any order, with any duplicates,
    has the same fingerprint."""
    digest = hashlib.blake2b(b"str" if are_str else b"bytes", digest_size=16)
    digest.update(np.ascontiguousarray(starts, dtype="<i8").tobytes())
    digest.update(np.ascontiguousarray(flat, dtype=np.uint8).tobytes())
    return digest.hexdigest()


_Automaton = TypeVar("_Automaton", bound="TrieAutomaton")


def state_index(state: Any, what: str = "states") -> int:
    """``state`` as an int; floats, bools and other non-integers are rejected, not truncated."""
    return state if type(state) is int else integer(state, what)


def _count(states: Any) -> int:
    """How many states a batch holds; a batch that is no sequence is a StateError."""
    try:
        return len(states)
    except TypeError:
        raise StateError(f"states must be a sequence of integers, got {type(states).__name__} {states!r:.40}") from None


def _int64(values: Any) -> Any:
    """What the kernel reads: lists and tuples as they are, signed integer arrays as int64
    (anything else goes unchanged, and the kernel defers it to the reference)."""
    if type(values) is np.ndarray and values.dtype.kind == "i" and values.dtype != np.int64:
        return values.astype(np.int64)
    return values


def set_bits(target: npt.NDArray[np.int32], positions: npt.NDArray[Any], tokens: npt.NDArray[np.int32]) -> None:
    """Set bit ``token % 32`` of ``target[position]`` for each pair: the bitmask of tokens
    sorted within each row (equal positions adjacent), one OR per word, then one scatter."""
    if not len(tokens):
        return
    bits = np.left_shift(np.uint32(1), (tokens & 31).astype(np.uint32))
    starts = np.flatnonzero(np.concatenate(([True], positions[1:] != positions[:-1])))
    target[positions[starts]] = np.bitwise_or.reduceat(bits, starts).view(np.int32)


def _count_words(tokens: npt.NDArray[np.int32], offsets: npt.NDArray[np.int32]) -> int:
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


def _dense_rows(
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


_ROW_BY_ROW = 24  # fill_bitmask and next_states handle batches up to this size row by row (measured)


class _AutomatonCore:
    """TrieAutomaton's per-step methods in Python. With the C extension,
    ``triemask._native.AutomatonCore`` takes its place: the same methods in C (a Python
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


if TYPE_CHECKING or _kernels.KERNELS is None:  # noqa: SIM108 (type checkers see the Python class)
    _Core = _AutomatonCore
else:
    _Core = _kernels.KERNELS.AutomatonCore


class TrieAutomaton(_Core):
    """The compiled form of one set of values, for one vocabulary. Immutable.

    Create one with :meth:`triemask.Compiler.compile`. States are plain integers:

    * ``0 .. num_nodes - 1`` are trie nodes, one per distinct prefix of the values
      (``initial_state`` is 0, the empty prefix);
    * ``num_nodes + i`` is the final state reached by EOS after the ``i``-th value
      (values in sorted byte order); nothing is allowed in it;
    * :data:`DEAD` (-1) is where a rejected token leads.

    Each node's allowed tokens are stored once, as a CSR of ``(token, next state)``
    edges and as the non-zero words of its bitmask row, so a mask is a lookup whose
    cost depends on the number of allowed tokens only, not on the number of values.
    The arrays are read-only and the object holds no mutable state: one automaton
    may serve any number of requests and threads.
    """

    __slots__ = (
        "_compile_seconds",
        "_dense_nodes",
        "_dense_rows",
        "_dests_view",
        "_edge_dests",
        "_edge_offsets",
        "_edge_offsets_view",
        "_edge_tokens",
        "_eos",
        "_eos_token_ids",
        "_input_values",
        "_level_offsets",
        "_num_nodes",
        "_num_values",
        "_set_fingerprint",
        "_terminal_nodes",
        "_terminal_values",
        "_tokens_view",
        "_value_flat",
        "_value_starts",
        "_values_are_str",
        "_vocab_fingerprint",
        "_vocab_size",
        "_width",
    )

    def __init__(
        self,
        *,
        edge_offsets: npt.NDArray[np.int32],
        edge_tokens: npt.NDArray[np.int32],
        edge_dests: npt.NDArray[np.int32],
        terminal_nodes: _IntArray,
        terminal_values: _IntArray,
        value_flat: _IntArray,
        value_starts: _IntArray,
        values_are_str: bool,
        input_values: int,
        level_offsets: _IntArray,
        vocab_size: int,
        vocab_fingerprint: str,
        eos_token_ids: tuple[int, ...],
        eos: bool,
        compile_seconds: float,
        dense_nodes: npt.NDArray[np.int32] | None = None,
    ) -> None:
        self._num_nodes = len(edge_offsets) - 2  # the last offset pair is an empty sentinel
        self._num_values = len(value_starts) - 1
        self._edge_offsets = edge_offsets
        self._edge_tokens = edge_tokens
        self._edge_dests = edge_dests
        self._terminal_nodes = terminal_nodes
        self._terminal_values = terminal_values
        self._value_flat = value_flat
        self._value_starts = value_starts
        self._values_are_str = values_are_str
        self._input_values = input_values
        self._level_offsets = level_offsets
        self._vocab_size = vocab_size
        self._width = bitmask_width(vocab_size)
        self._vocab_fingerprint = vocab_fingerprint
        self._eos_token_ids = eos_token_ids
        self._eos = eos
        self._compile_seconds = compile_seconds
        self._set_fingerprint: str | None = None  # computed on first use
        # the rows of the nodes allowing half a row's worth of tokens, derived (the nodes are
        # saved, the rows never)
        self._dense_nodes, self._dense_rows = _dense_rows(
            edge_tokens, edge_offsets, self._num_nodes, self._width, dense_nodes
        )
        for array in self._arrays():
            array.flags.writeable = False
        # memoryviews give the per-step paths Python ints without numpy scalar overhead.
        self._edge_offsets_view = edge_offsets.data
        self._tokens_view = edge_tokens.data
        self._dests_view = edge_dests.data
        self._kernel: Any = None
        native = _kernels.KERNELS
        if native is not None:  # the C loops of the per-step and batch paths
            self._kernel = native.Kernel(
                edge_offsets,
                edge_tokens,
                edge_dests,
                self._dense_nodes,
                self._dense_rows,
                self._num_nodes,
                self._num_nodes + self._num_values,
                self._width,
                dense_threshold(self._width),
            )

    # ------------------------------------------------------------------ files

    _kind: ClassVar[str] = "trie"
    _ARRAYS: ClassVar[tuple[str, ...]] = (
        "edge_offsets",
        "edge_tokens",
        "edge_dests",
        "terminal_nodes",
        "terminal_values",
        "value_flat",
        "value_starts",
        "level_offsets",
    )
    _DERIVED: ClassVar[tuple[str, ...]] = ("dense_nodes",)  # saved to spare loading a pass; optional in a file

    def _meta(self) -> dict[str, Any]:
        """The scalar fields a file stores (JSON), besides the arrays."""
        return {
            "values_are_str": self._values_are_str,
            "input_values": self._input_values,
            "vocab_size": self._vocab_size,
            "vocab_fingerprint": self._vocab_fingerprint,
            "eos_token_ids": list(self._eos_token_ids),
            "eos": self._eos,
            "compile_seconds": self._compile_seconds,
        }

    def _stored_arrays(self) -> dict[str, npt.NDArray[Any]]:
        return {name: getattr(self, f"_{name}") for name in (*self._ARRAYS, *self._DERIVED)}

    @classmethod
    def _from_stored(
        cls: type[_Automaton], meta: dict[str, Any], arrays: dict[str, Any], vocab: Any = None
    ) -> _Automaton:
        cls._check_stored(meta, arrays, vocab)
        return cls(**_stored_arguments(cls, arrays), **_meta_arguments(meta))

    @classmethod
    def _check_edges(cls, arrays: dict[str, Any], vocab: Any) -> None:
        """That the edges are those of the values (:func:`_check_edges_spell_values`); a layout
        whose edges are not a trie's checks what it can in :meth:`_check_stored`."""
        _check_edges_spell_values(arrays, vocab)

    @classmethod
    def _check_stored(cls, meta: dict[str, Any], arrays: dict[str, Any], vocab: Any = None) -> None:
        """Check a file's arrays before anything is built from them: dtypes, bounds, order,
        and what later reads trust (terminal and value arrays, UTF-8 values, edges that go
        one level down at least, so no walk loops). Raises AutomatonFileError naming the array.
        ``vocab``: the vocabulary it is loaded for (its scalar fields are checked before)."""
        for name in cls._ARRAYS:
            expect_dtype(arrays, name, _STORED_DTYPES[name])
        vocab_size = meta["vocab_size"]
        offsets, tokens, dests = arrays["edge_offsets"], arrays["edge_tokens"], arrays["edge_dests"]
        num_nodes = len(offsets) - 2
        value_starts, value_flat = arrays["value_starts"], arrays["value_flat"]
        num_values = len(value_starts) - 1
        if num_nodes < 1 or int(offsets[0]) != 0 or (np.diff(offsets) < 0).any() or int(offsets[-1]) != len(tokens):
            raise AutomatonFileError("edge offsets out of order or out of bounds", field="edge_offsets")
        if len(dests) != len(tokens):
            raise AutomatonFileError("edge tokens and destinations of unequal lengths", field="edge_dests")
        expect_within(tokens, 0, vocab_size, "edge_tokens")
        expect_within(dests, 0, num_nodes + num_values, "edge_dests")
        if num_values < 0 or int(value_starts[0]) != 0 or (np.diff(value_starts) < 0).any():
            raise AutomatonFileError("value offsets out of order", field="value_starts")
        if int(value_starts[-1]) != len(value_flat):
            raise AutomatonFileError("value offsets past the values' bytes", field="value_starts")
        terminal_nodes, terminal_values = arrays["terminal_nodes"], arrays["terminal_values"]
        if len(terminal_nodes) != len(terminal_values) or (np.diff(terminal_nodes) <= 0).any():
            raise AutomatonFileError("terminal nodes not ascending, or not one per value", field="terminal_nodes")
        expect_within(terminal_nodes, 0, num_nodes, "terminal_nodes")
        expect_within(terminal_values, 0, num_values, "terminal_values")
        if meta["values_are_str"] and len(value_flat):
            starts = value_starts[:-1][np.diff(value_starts) > 0]
            try:  # UTF-8 as a whole, and every value starts a character: each value is UTF-8
                value_flat.tobytes().decode("utf-8")
            except UnicodeDecodeError:
                raise AutomatonFileError("values that are not UTF-8", field="value_flat") from None
            if ((value_flat[starts] & 0xC0) == 0x80).any():
                raise AutomatonFileError("values that are not UTF-8", field="value_flat")
        levels = arrays["level_offsets"]
        if len(levels) < 2 or int(levels[0]) != 0 or (np.diff(levels) < 0).any() or int(levels[-1]) != num_nodes:
            raise AutomatonFileError("level offsets out of order or not over every node", field="level_offsets")
        # nodes are numbered level by level, so every edge leads to a larger id (a final state's
        # included): then no walk loops
        sources = np.repeat(np.arange(num_nodes, dtype=np.int32), np.diff(offsets[: num_nodes + 1]))
        if (dests[: len(sources)] <= sources).any():
            raise AutomatonFileError("an edge that leads back up (a cycle)", field="edge_dests")

    @property
    def set_fingerprint(self) -> str:
        """Fingerprint of the set of values (order and duplicates do not matter; the vocabulary
        does not enter): equal sets compiled in any layout have equal fingerprints."""
        if self._set_fingerprint is None:
            flat: Any = self._value_flat
            self._set_fingerprint = set_fingerprint(flat, self._value_starts, self._values_are_str)
        return self._set_fingerprint

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the automaton to ``path`` in triemask's file format (no pickle): versioned,
        with the vocabulary's and the set's fingerprints, every array aligned and checksummed,
        written atomically. Load it with :meth:`load`."""
        kind, meta, arrays = self.file_parts()
        _storage.write(
            path, kind, meta, arrays, vocab_fingerprint=self._vocab_fingerprint, set_fingerprint=self.set_fingerprint
        )

    def file_parts(self) -> tuple[str, dict[str, Any], dict[str, npt.NDArray[Any]]]:
        """What triemask's file format stores of this automaton: its kind, its scalar fields
        and its arrays (:meth:`save` writes them; a compiled schema stores its fields' automata
        this way, and :func:`restore_parts` makes the automaton again)."""
        return self._kind, self._meta(), self._stored_arrays()

    @classmethod
    def load(
        cls: type[_Automaton],
        path: str | os.PathLike[str],
        *,
        vocab: Any,
        mmap: bool = True,
        verify: bool = True,
    ) -> _Automaton:
        """Load an automaton written by :meth:`save` (any layout: the file says which).

        Parameters
        ----------
        path : str or path
            The file.
        vocab : Vocabulary
            The vocabulary it must have been compiled for (checked by fingerprint, and its
            size and EOS ids against the file's).
        mmap : bool
            Map the file read-only instead of reading it: nothing is copied, and every
            process mapping the same file shares its pages. The file must not be
            modified while mapped (:meth:`save` replaces files by renaming, which is safe).
        verify : bool
            Check every array's checksums (reads the whole file once, on worker threads while
            the automaton is built) and, for a trie, that its edges are those of its values
            (each edge's token walked against the values' trie); the header and every field
            are always checked (dtypes, bounds, order, no cycle) before anything is built.

        Raises
        ------
        AutomatonFileError
            The file is missing, truncated, corrupt, not a triemask file, of a newer format,
            of another kind than ``cls``, or compiled for another vocabulary (``.field``).
        """
        from ._vocabulary import Vocabulary

        if not isinstance(vocab, Vocabulary):
            raise ArgumentTypeError(f"load needs vocab=<the triemask.Vocabulary>, got {type(vocab).__qualname__}")

        def build(stored: _storage.Stored) -> _Automaton:
            held = _KINDS[stored.kind]
            if not issubclass(held, cls):
                raise AutomatonFileError(f"{stored.source} holds a {held.__name__}, not a {cls.__name__}", field="kind")
            # an instance of `held`, a subclass of cls; with verify, its edges checked against its values
            return cast(_Automaton, restore_stored(stored, vocab, check_edges=verify))

        return _storage.load(
            path, kinds=tuple(_KINDS), vocab_fingerprint=vocab.fingerprint, build=build, use_mmap=mmap, verify=verify
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # pickling goes through the file format: versioned, checked, no pickled internals
        kind, meta, arrays = self.file_parts()
        blob = _storage.to_bytes(
            kind, meta, arrays, vocab_fingerprint=self._vocab_fingerprint, set_fingerprint=self.set_fingerprint
        )
        return (_from_bytes, (blob,))

    def _arrays(self) -> list[npt.NDArray[Any]]:
        return [
            self._edge_offsets,
            self._edge_tokens,
            self._edge_dests,
            self._dense_nodes,
            self._dense_rows,
            self._terminal_nodes,
            self._terminal_values,
            self._value_flat,
            self._value_starts,
            self._level_offsets,
        ]

    # ------------------------------------------------------------------ properties

    @property
    def initial_state(self) -> int:
        """The state before any token: the empty prefix (0)."""
        return 0

    @property
    def num_nodes(self) -> int:
        """Number of trie nodes (distinct prefixes of the values, the empty one included)."""
        return self._num_nodes

    @property
    def num_states(self) -> int:
        """Number of states: trie nodes plus one final state per value (DEAD excluded)."""
        return self._num_nodes + self._num_values

    @property
    def num_values(self) -> int:
        """Number of distinct values."""
        return self._num_values

    @property
    def vocab_size(self) -> int:
        """The model's logits width this automaton was compiled for."""
        return self._vocab_size

    @property
    def vocab_fingerprint(self) -> str:
        """Fingerprint of the vocabulary this automaton was compiled for."""
        return self._vocab_fingerprint

    @property
    def eos(self) -> bool:
        """Whether EOS ends a complete value (``compile(..., eos=True)``)."""
        return self._eos

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """EOS ids allowed after a complete value (empty when ``eos`` is False)."""
        return self._eos_token_ids if self._eos else ()

    @property
    def accepting_nodes(self) -> npt.NDArray[np.int32]:
        """The trie nodes where a value is complete, ascending (read-only); the value
        of ``accepting_nodes[i]`` is not in general ``value(i)``: use :meth:`value_of`."""
        return np.unique(self._terminal_nodes).astype(np.int32)

    @property
    def memory_bytes(self) -> int:
        """Bytes held by this automaton's arrays (the shared token index excluded)."""
        return sum(a.nbytes for a in self._arrays())

    # ------------------------------------------------------------------ queries

    def _node(self, state: int) -> int:
        """The trie node of ``state``, or ``num_nodes`` (an empty sentinel) for final and DEAD."""
        if type(state) is not int:
            state = state_index(state)
        if 0 <= state < self._num_nodes:
            return state
        if state == DEAD or self._num_nodes <= state < self._num_nodes + self._num_values:
            return self._num_nodes
        raise StateError(
            f"state {state!r} is not a state of this automaton: expected DEAD (-1) or "
            f"0 <= state < num_states={self.num_states}"
        )

    def allowed_token_ids(self, state: int) -> npt.NDArray[np.int32]:
        """Ids of the tokens allowed in ``state``, ascending (EOS included when allowed).

        The result is a read-only view into the automaton.
        """
        node = self._node(state)
        return self._edge_tokens[self._edge_offsets_view[node] : self._edge_offsets_view[node + 1]]

    def edges(self, state: int) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """The tokens allowed in ``state`` (ascending) and the state each leads to, read-only."""
        node = self._node(state)
        lo, hi = self._edge_offsets_view[node], self._edge_offsets_view[node + 1]
        return self._edge_tokens[lo:hi], self._edge_dests[lo:hi]

    def allowed_token_pairs(
        self, states: Sequence[int] | npt.NDArray[np.integer[Any]]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]:
        """Every allowed ``(row, token id)`` pair of a batch of states, in one lookup.

        Row ``i`` contributes ``allowed_token_ids(states[i])`` (final and DEAD states
        none), so the work is proportional to the allowed tokens, not to the
        vocabulary: masking logits by gather and scatter needs nothing more.

        Returns
        -------
        rows : int64 array
            The index in ``states`` of each pair, ascending.
        token_ids : int32 array
            The allowed token of each pair.
        """
        kernel = self._kernel
        if kernel is not None:
            pairs = kernel.pairs(_int64(states))
            if pairs is not None:
                return np.frombuffer(pairs[0], dtype=np.int64), np.frombuffer(pairs[1], dtype=np.int32)
        nodes = self._nodes(states)
        first, last, edge_tokens, _ = self._csr(nodes)
        counts = last - first
        ends = np.cumsum(counts)
        total = int(ends[-1]) if len(nodes) else 0
        index = np.arange(total) + np.repeat(last - ends, counts)
        return np.repeat(np.arange(len(nodes), dtype=np.int64), counts), edge_tokens[index]

    def _next_state_reference(self, state: int, token_id: int) -> int:
        # next_state (the C one defers here for anything but exact ints it can look up)
        kernel = self._kernel
        if kernel is not None:
            following: int | None = kernel.next(state, token_id)
            if following is not None:  # None: an argument for the checks below
                return following
        if type(state) is not int or type(token_id) is not int:  # one test on the per-step path
            state, token_id = state_index(state), state_index(token_id, "token ids")
        if not 0 <= state < self._num_nodes:
            self._node(state)  # raises for ids that are no state; final and DEAD allow nothing
            return DEAD
        lo = self._edge_offsets_view[state]
        hi = self._edge_offsets_view[state + 1]
        i = bisect_left(self._tokens_view, token_id, lo, hi)
        if i < hi and self._tokens_view[i] == token_id:
            return int(self._dests_view[i])
        return DEAD

    def next_states(self, states: npt.ArrayLike, token_ids: npt.ArrayLike) -> npt.NDArray[np.int32]:
        """Vectorised :meth:`next_state` over a batch (DEAD where rejected)."""
        kernel = self._kernel
        if kernel is not None:
            out = np.empty(_count(states), dtype=np.int32)
            if kernel.next_batch(_int64(states), _int64(token_ids), out):
                return out
        if (
            isinstance(states, list | tuple | np.ndarray)
            and isinstance(token_ids, list | tuple | np.ndarray)
            and len(states) == len(token_ids) <= _ROW_BY_ROW
        ):
            # a few rows: a bisect per row beats a dozen NumPy calls
            values = states.tolist() if isinstance(states, np.ndarray) else states
            tokens_list = token_ids.tolist() if isinstance(token_ids, np.ndarray) else token_ids
            following = [
                self.next_state(state_index(state), state_index(token))
                for state, token in zip(values, tokens_list, strict=True)
            ]
            return np.array(following, dtype=np.int32)
        nodes = self._nodes(states)
        tokens = np.asarray(token_ids)
        if tokens.shape != nodes.shape:
            raise StateError(f"states has shape {nodes.shape} but token_ids has shape {tokens.shape}")
        lo, hi, edge_tokens, edge_dests = self._csr(nodes)
        counts = hi - lo
        result = np.full(len(nodes), DEAD, dtype=np.int32)
        total = int(counts.sum())
        if total:
            row = np.repeat(np.arange(len(nodes)), counts)
            edge = np.arange(total) + np.repeat(lo - (np.cumsum(counts) - counts), counts)
            match = np.flatnonzero(edge_tokens[edge] == tokens[row])
            result[row[match]] = edge_dests[edge[match]]
        return result

    def is_accepting(self, state: int) -> bool:
        """Whether the tokens so far spell a complete value (true in final states too)."""
        return self._value_index(state) is not None

    def value_index(self, state: int) -> int | None:
        """The index (in sorted order, as :meth:`value`) of the value complete in ``state``,
        or None when none is."""
        return self._value_index(state)

    @property
    def values_are_str(self) -> bool:
        """Whether the values are ``str`` (else ``bytes``)."""
        return self._values_are_str

    def with_values(
        self, added: Iterable[Any] = (), removed: Iterable[Any] = (), *, compiler: Any = None
    ) -> TrieAutomaton:
        """A new automaton for this set plus ``added`` minus ``removed``, at a cost
        proportional to the change: the same masks as compiling the new set, for states
        numbered differently (an :class:`~triemask.UpdatedTrieAutomaton`: this automaton,
        tombstones and a delta automaton merged at lookup, until its ``compacted()``).
        Past 5% of the set changed, or for a vocabulary lacking single-byte tokens, the new
        set is compiled whole. This automaton is unchanged.

        Parameters
        ----------
        added, removed : iterables of values (the set's type: str or bytes)
            Adding a member is a no-op; removing a value that is not a member raises.
        compiler : Compiler, optional
            The compiler of this automaton's vocabulary (by default the one most recently
            built for it in this process).
        """
        from ._compile import compiler_for_fingerprint
        from ._update import updated

        if compiler is None:
            compiler = compiler_for_fingerprint(self._vocab_fingerprint)
        return updated(self, added, removed, compiler)

    def is_final(self, state: int) -> bool:
        """Whether ``state`` is a final state, reached by EOS after a complete value."""
        self._node(state)
        return self._num_nodes <= state < self._num_nodes + self._num_values

    def value_of(self, state: int) -> str | bytes | None:
        """The completed value in ``state`` (as given: ``str`` or ``bytes``), else None."""
        index = self._value_index(state)
        return None if index is None else self.value(index)

    def value(self, index: int) -> str | bytes:
        """The ``index``-th distinct value, values in sorted (UTF-8 byte) order."""
        if type(index) is not int:
            index = state_index(index, "value indices")
        if not 0 <= index < self._num_values:
            raise ValueIndexError(f"value index {index} is outside [0, {self._num_values})")
        raw = self._value_flat[self._value_starts[index] : self._value_starts[index + 1]].tobytes()
        return raw.decode("utf-8") if self._values_are_str else raw

    def values(self) -> list[str | bytes]:
        """All distinct values, in sorted (UTF-8 byte) order."""
        return [self.value(i) for i in range(self._num_values)]

    def _value_index(self, state: int) -> int | None:
        node = self._node(state)
        if node == self._num_nodes:
            return None if state == DEAD else state - self._num_nodes
        i = int(np.searchsorted(self._terminal_nodes, np.int32(node)))  # an int32 key: no cast of the array
        if i < len(self._terminal_nodes) and self._terminal_nodes[i] == node:
            return int(self._terminal_values[i])
        return None

    def edge_arrays(self) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """Every node's allowed tokens at once, read-only: ``(offsets, tokens, dests)``; node
        ``n``'s tokens (ascending) are ``tokens[offsets[n]:offsets[n + 1]]`` and lead to the
        states ``dests[...]`` (``offsets`` has ``num_nodes + 2`` entries, the last pair an
        empty sentinel). For uploading the automaton elsewhere (``DeviceAutomaton``)."""
        return self._edge_offsets, self._edge_tokens, self._edge_dests

    def _csr(self, nodes: npt.NDArray[np.int64]) -> tuple[_IntArray, _IntArray, _IntArray, _IntArray]:
        """The edges of a batch of nodes (the sentinel ``num_nodes`` has none) as
        ``(first, last, tokens, dests)``: node ``nodes[i]``'s are ``tokens[first[i]:last[i]]``."""
        return self._edge_offsets[nodes], self._edge_offsets[nodes + 1], self._edge_tokens, self._edge_dests

    def _nodes(self, states: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Validated trie nodes of a batch of states (final and DEAD -> empty sentinel)."""
        s = np.asarray(states)
        if s.dtype.kind not in "iu" or s.ndim != 1:
            if s.ndim == 1 and s.size == 0:
                return np.zeros(0, dtype=np.int64)
            raise StateError(f"states must be a 1-D array of integers, got dtype {s.dtype}, shape {s.shape}")
        if s.dtype.kind == "u" and s.size and int(s.max()) >= self.num_states:  # would wrap to DEAD
            raise StateError(f"state {int(s.max())} is not a state of this automaton (0 <= state < {self.num_states})")
        s = s.astype(np.int64, copy=False)
        # As unsigned, DEAD (-1) and finals clip to the sentinel; ids below -1 wrap
        # to huge values, so one bound check catches every invalid id.
        if s.size and int((s + 1).view(np.uint64).max()) > self._num_nodes + self._num_values:
            bad = s[((s + 1).view(np.uint64)) > self._num_nodes + self._num_values][0]
            raise StateError(
                f"state {int(bad)} is not a state of this automaton (DEAD or 0 <= state < {self.num_states})"
            )
        return np.minimum(s.view(np.uint64), self._num_nodes).view(np.int64)

    # ------------------------------------------------------------------ bitmasks

    def _fill_bitmask_reference(
        self, bitmask: Any, states: Sequence[int] | npt.NDArray[np.integer[Any]], *, rows: npt.ArrayLike | None = None
    ) -> None:
        # fill_bitmask (the C one fills one state's row itself and defers the rest here)
        kernel = self._kernel
        if kernel is not None:
            # a CPU torch tensor: its numpy view (as_bitmask_array raises for a wrong one)
            target = bitmask if type(bitmask) is np.ndarray else as_bitmask_array(bitmask, self._vocab_size)
            if rows is None and type(states) in (list, tuple) and len(states) == 1:
                if kernel.fill(target, 0, states[0]):  # the per-step path
                    return
            elif kernel.fill_batch(target, _int64(states), None if rows is None else _int64(rows)):
                return
            # anything the kernel deferred: the reference below, which raises the typed errors
        if (  # one request per call, the per-step path: as_bitmask_array's checks, inlined
            rows is None
            and type(states) in (list, tuple)
            and len(states) == 1
            and type(bitmask) is np.ndarray
            and bitmask.dtype is INT32
            and bitmask.ndim == 2
            and (shape := bitmask.shape)[1] == self._width
            and shape[0] >= 1
        ):
            flags = bitmask.flags
            if flags.c_contiguous and flags.writeable:  # _fill_row, inlined: this path is per token
                state = states[0]
                if type(state) is not int:
                    state = state_index(state)
                self._fill_row(bitmask[0], state)
                return
        array = as_bitmask_array(bitmask, self._vocab_size)
        if _count(states) <= _ROW_BY_ROW:  # a few rows: numpy call overhead dominates
            self._fill_rows(array, states, rows)
            return
        nodes = self._nodes(states)
        batch = len(nodes)
        if batch == 0:
            if rows is not None and np.size(rows):
                raise StateError(f"rows must be 0 integers (one per state), got {np.size(rows)}")
            return
        if rows is None:
            if batch > array.shape[0]:
                raise StateError(f"{batch} states but the bitmask has only {array.shape[0]} rows")
            row_base = np.arange(0, batch * self._width, self._width, dtype=np.int64)
            array[:batch].view(np.uint8).fill(0)
        else:
            row_ids = np.asarray(rows)
            if row_ids.shape != (batch,) or row_ids.dtype.kind not in "iu":
                raise StateError(
                    f"rows must be {batch} integers (one per state), got dtype {row_ids.dtype}, shape {row_ids.shape}"
                )
            if batch and (int(row_ids.min()) < 0 or int(row_ids.max()) >= array.shape[0]):
                raise StateError(f"rows must lie in [0, {array.shape[0]}), got min {row_ids.min()} max {row_ids.max()}")
            if np.unique(row_ids).size != batch:
                raise StateError("rows must be distinct (each row receives one state's mask)")
            array[row_ids] = 0
            row_base = row_ids.astype(np.int64) * self._width
        first, last, edge_tokens, _ = self._csr(nodes)
        counts = last - first
        dense = self._dense_index(nodes, counts)
        if (dense >= 0).any():  # rows stored whole: copied, and left out of the token scatter
            whole = np.flatnonzero(dense >= 0)
            stored = self._dense_rows.reshape(-1, self._width)
            array.reshape(-1, self._width)[row_base[whole] // self._width] = stored[dense[whole]]
            counts = np.where(dense >= 0, 0, counts)
        ends = np.cumsum(counts)
        total = int(ends[-1]) if batch else 0
        if total:
            tokens = edge_tokens[np.arange(total) + np.repeat(last - ends, counts)]
            set_bits(array.reshape(-1), np.repeat(row_base, counts) + (tokens >> 5), tokens)

    def _fill_rows(self, array: npt.NDArray[np.int32], states: Any, rows: Any) -> None:
        """fill_bitmask for a few rows: one zeroing call, then one scatter per row."""
        count = len(states)
        if count > array.shape[0]:
            raise StateError(f"{count} states but the bitmask has only {array.shape[0]} rows")
        values = [state_index(state) for state in (states.tolist() if isinstance(states, np.ndarray) else list(states))]
        for state in values:  # validate before writing, as the vectorised path does
            if not 0 <= state < self._num_nodes:
                self._node(state)  # raises for ids that are no state
        if rows is None:
            targets: Sequence[int] = range(count)
            array[:count].fill(0)
        else:
            targets = self._few_rows(rows, count, array.shape[0])
            array[targets] = 0
        for row, state in zip(targets, values, strict=True):
            self._fill_row(array[row], state)

    @staticmethod
    def _few_rows(rows: Any, count: int, height: int) -> list[int]:
        """``rows`` as a list of ``count`` distinct row indices in ``[0, height)``."""
        try:
            targets = [state_index(row, "rows") for row in rows]
        except TypeError:
            raise StateError(f"rows must be {count} integers (one per state), got {rows!r}") from None
        if len(targets) != count:
            raise StateError(f"rows must be {count} integers (one per state), got {len(targets)}")
        if any(not 0 <= row < height for row in targets):
            raise StateError(f"rows must lie in [0, {height}), got {targets}")
        if len(set(targets)) != count:
            raise StateError(f"rows must be distinct, got {targets}")
        return targets

    def fill_row(self, bitmask: Any, state: int, row: int = 0) -> None:
        """Overwrite row ``row`` of ``bitmask`` with the mask of ``state``: one request's
        step (:meth:`triemask.Matcher.fill_next_token_bitmask`).

        ``bitmask`` is as in :meth:`fill_bitmask` (or one row of it).
        """
        kernel = self._kernel
        if kernel is not None and type(bitmask) is np.ndarray and kernel.fill(bitmask, row, state):
            return
        array = as_bitmask_array(bitmask, self._vocab_size)
        if kernel is not None and array.ndim == 2 and kernel.fill(array, row, state):  # a torch tensor's view
            return
        row = integer(row, "row", StateError, "an integer")
        if not 0 <= row < array.shape[0]:
            raise StateError(f"row {row} is outside the bitmask's {array.shape[0]} rows")
        self._fill_row(array[row], state_index(state))

    def _fill_row(self, row: npt.NDArray[np.int32], state: int) -> None:
        """Overwrite one bitmask row (a 1-D int32 view) with ``state``'s mask."""
        if not 0 <= state < self._num_nodes:
            self._node(state)  # raises for ids that are no state; final and DEAD rows are zero
            row.fill(0)
            return
        lo, hi = self._edge_offsets_view[state], self._edge_offsets_view[state + 1]
        if hi - lo >= dense_threshold(self._width):  # perhaps a row stored whole
            dense = self._dense_index(np.array([state]), np.array([hi - lo]))[0]
            if dense >= 0:
                row[:] = self._dense_rows[dense * self._width : (dense + 1) * self._width]
                return
        row.fill(0)
        allowed = self._edge_tokens[lo:hi]
        set_bits(row, allowed >> 5, allowed)

    def _dense_index(self, nodes: npt.NDArray[Any], counts: npt.NDArray[Any]) -> npt.NDArray[np.intp]:
        """For each node (with its number of edges), its row among the rows stored whole,
        or -1: every node with at least dense_threshold edges has one."""
        return np.where(counts >= dense_threshold(self._width), np.searchsorted(self._dense_nodes, nodes), -1)

    # ------------------------------------------------------------------ description

    def stats(self) -> dict[str, Any]:
        """Structure of the automaton.

        ``prefix_sharing_ratio`` is the paper's r = trie nodes (root excluded) /
        total bytes of the distinct values; ``valid_by_depth`` gives, for each
        depth, the number of nodes and the mean and max number of allowed tokens
        (EOS included) as in the paper's Table 15.
        """
        n = self._num_nodes
        per_node = np.diff(self._edge_offsets[: n + 1])
        value_bytes = int(self._value_starts[-1])
        by_depth = []
        for depth in range(len(self._level_offsets) - 1):
            counts = per_node[self._level_offsets[depth] : self._level_offsets[depth + 1]]
            by_depth.append(
                {
                    "depth": depth,
                    "nodes": int(counts.size),
                    "mean_valid": float(counts.mean()),
                    "max_valid": int(counts.max()),
                }
            )
        return {
            "values": self._num_values,
            "duplicates_collapsed": self._input_values - self._num_values,
            "value_bytes": value_bytes,
            "trie_nodes": n - 1,
            "prefix_sharing_ratio": (n - 1) / value_bytes if value_bytes else 0.0,
            "max_depth": len(self._level_offsets) - 2,
            "states": self.num_states,
            "edges": int(self._edge_offsets[-1]),
            "mask_words": _count_words(self._edge_tokens, self._edge_offsets[: n + 1]),
            "rows_stored_whole": len(self._dense_nodes),
            "memory_bytes": self.memory_bytes,
            "compile_seconds": self._compile_seconds,
            "eos": self._eos,
            "eos_token_ids": list(self.eos_token_ids),
            "vocab_size": self._vocab_size,
            "vocab_fingerprint": self._vocab_fingerprint,
            "valid_by_depth": by_depth,
        }

    def __repr__(self) -> str:
        return (
            f"TrieAutomaton(values={self._num_values}, nodes={self._num_nodes}, "
            f"edges={int(self._edge_offsets[-1])}, eos={self._eos}, memory_bytes={self.memory_bytes})"
        )


def native_kernel(automaton: TrieAutomaton) -> Any:
    """The automaton's C kernel (``next``, ``fill``, ``fill_batch``, ``next_batch``: each
    returns None to defer to the reference), or None without the extension. For the
    per-request matcher, whose step calls it directly."""
    return automaton._kernel


_STORED_DTYPES = {
    "edge_offsets": np.int32,
    "edge_tokens": np.int32,
    "edge_dests": np.int32,
    "terminal_nodes": np.int32,
    "terminal_values": np.int32,
    "value_flat": np.uint8,
    "value_starts": np.int64,
    "level_offsets": np.int64,
    "spell_ids": np.int32,
    "spell_offsets": np.int64,
    "spell_flat": np.uint8,
    "dag_in_offsets": np.int64,
    "dag_source": np.int32,
    "dag_byte": np.uint8,
    "dag_dest": np.int32,
    "dag_accepting": np.int32,
    "dag_level_offsets": np.int64,
}


def expect_dtype(arrays: dict[str, Any], name: str, dtype: Any) -> None:
    array = arrays[name]
    if not isinstance(array, np.ndarray) or array.dtype != dtype or array.ndim != 1:
        raise AutomatonFileError(f"{name} is not a 1-D {np.dtype(dtype)} array", field=name)


def expect_within(array: npt.NDArray[Any], low: int, high: int, name: str) -> None:
    if array.size and (int(array.min()) < low or int(array.max()) >= high):
        raise AutomatonFileError(f"{name} holds values outside [{low}, {high})", field=name)


def _check_meta(meta: Any, vocab: Any) -> None:
    """A file's scalar fields, against the vocabulary it is loaded for (when given): the
    logits width and EOS ids are the vocabulary's, never the file's word."""
    if not isinstance(meta, dict):
        raise AutomatonFileError("its fields are not an object", field="meta")
    vocab_size, eos = meta.get("vocab_size"), meta.get("eos_token_ids")
    if type(vocab_size) is not int or not 0 < vocab_size < 1 << 31:
        raise AutomatonFileError(f"vocab_size {vocab_size!r:.40} is not a positive int32", field="vocab_size")
    if not isinstance(eos, list) or not all(type(t) is int and 0 <= t < vocab_size for t in eos):
        raise AutomatonFileError(f"eos_token_ids {eos!r:.60} are not ids of the vocabulary", field="eos_token_ids")
    for name in ("values_are_str", "eos"):
        if type(meta.get(name)) is not bool:
            raise AutomatonFileError(f"{name} is not a boolean", field=name)
    if vocab is not None:
        if vocab_size != vocab.vocab_size:
            raise AutomatonFileError(
                f"vocab_size {vocab_size} is not the vocabulary's ({vocab.vocab_size})", field="vocab_size"
            )
        if tuple(eos) != tuple(vocab.eos_token_ids):
            raise AutomatonFileError(
                f"eos_token_ids {eos} are not the vocabulary's {list(vocab.eos_token_ids)}", field="eos_token_ids"
            )


def _utf8_steps() -> npt.NDArray[np.uint16]:
    """``steps[states, byte]``: the set of UTF-8 decoder states after ``byte`` from a set of
    them (bit i: state i; 0 between characters, 1-3 that many continuation bytes due, 4-7 the
    restricted second bytes after E0, ED, F0, F4 (RFC 3629); bit 8: not UTF-8)."""
    one = np.full((8, 256), 8, dtype=np.int64)
    one[0, :0x80] = 0
    one[0, 0xC2:0xE0], one[0, 0xE1:0xF0], one[0, 0xF1:0xF4] = 1, 2, 3
    one[0, 0xE0], one[0, 0xED], one[0, 0xF0], one[0, 0xF4] = 4, 5, 6, 7
    one[1, 0x80:0xC0], one[2, 0x80:0xC0], one[3, 0x80:0xC0] = 0, 1, 2
    one[4, 0xA0:0xC0], one[5, 0x80:0xA0], one[6, 0x90:0xC0], one[7, 0x80:0x90] = 1, 1, 2, 2
    steps = np.zeros((512, 256), dtype=np.uint16)
    for state in range(8):
        has = (np.arange(512) >> state) & 1 == 1
        steps[has] |= (1 << one[state]).astype(np.uint16)
    return steps


_UTF8_STEPS: npt.NDArray[np.uint16] | None = None


def _spells_utf8(
    source: npt.NDArray[Any],
    byte: npt.NDArray[Any],
    dest: npt.NDArray[Any],
    levels: npt.NDArray[Any],
    accepting: npt.NDArray[Any],
) -> bool:
    """Whether every path of a byte DAG (edges grouped by destination, nodes numbered by
    level) from node 0 to an accepting node spells UTF-8: the decoder states reaching each
    node, propagated level by level."""
    steps = utf8_steps()
    reach = np.zeros(int(levels[-1]), dtype=np.uint16)
    if not len(reach):
        return True
    reach[0] = 1
    for low, high in zip(levels[1:-1].tolist(), levels[2:].tolist(), strict=True):  # destinations by level
        lo, hi = np.searchsorted(dest, low), np.searchsorted(dest, high)
        np.bitwise_or.at(reach, dest[lo:hi], steps[reach[source[lo:hi]], byte[lo:hi]])
    return not (reach & 0x100).any() and not (reach[accepting] & 0xFE).any()


def _check_edges_spell_values(arrays: dict[str, Any], vocab: Any) -> None:
    """That a trie file's nodes and edges are those of *its* values, so that it allows no token
    its values' language refuses, whatever else the file held (another set's edges under these
    values included): the values' trie is built again (the compiler's construction, so its
    numbering) and compared node for node, and every edge's token is walked back from its
    destination, byte by byte, to its source (in C: 11 ms for 2.3 million edges, with the trie
    built again in 16 ms). Edges a file left out cannot be told without compiling again: they
    narrow masks, never widen them."""
    value_flat, value_starts = arrays["value_flat"], arrays["value_starts"]
    offsets, tokens, dests = arrays["edge_offsets"], arrays["edge_tokens"], arrays["edge_dests"]
    n = len(offsets) - 2
    trie = build_trie(value_flat, value_starts)
    if trie.num_nodes != n or not np.array_equal(trie.level_offsets, arrays["level_offsets"]):
        raise AutomatonFileError("nodes that are not the trie of the values", field="edge_offsets")
    if len(trie.terminal) != len(value_starts) - 1 or not np.array_equal(
        trie.terminal[arrays["terminal_values"]], arrays["terminal_nodes"]
    ):
        raise AutomatonFileError("terminal nodes that are not the values' ends", field="terminal_nodes")
    lengths, token_offsets, data = vocab.byte_table()
    eos = np.asarray(vocab.eos_token_ids, dtype=np.int32)
    native = _kernels.KERNELS
    parts = (trie.parent, trie.byte, offsets, tokens, dests, lengths, token_offsets, data, trie.terminal, eos)
    bad = native.spelled_edges(*parts) if native is not None else first_misspelled_edge(*parts)
    if bad >= 0:
        raise AutomatonFileError(f"edge {bad}'s token does not spell the path it takes", field="edge_tokens")


def first_misspelled_edge(
    parent: npt.NDArray[np.int32],
    byte: npt.NDArray[np.uint8],
    offsets: npt.NDArray[np.int32],
    tokens: npt.NDArray[np.int32],
    dests: npt.NDArray[np.int32],
    lengths: npt.NDArray[np.int32],
    token_offsets: npt.NDArray[np.int64],
    data: bytes,
    terminal: npt.NDArray[np.int32],
    eos: npt.NDArray[np.int32],
) -> int:
    """The NumPy reference of the C ``spelled_edges``: the index of the first edge whose token
    does not spell the path from its source to its destination (all walked back together, a
    byte a step), or, to final state ``n + v``, that is not an EOS token from value ``v``'s
    node; else -1."""
    n = len(parent)
    raw = np.frombuffer(data, dtype=np.uint8)
    sources = np.repeat(np.arange(n, dtype=np.int64), np.diff(offsets[: n + 1]))
    bad = np.zeros(len(sources), dtype=bool)
    final = np.flatnonzero(dests[: len(sources)] >= n)
    value = dests[final].astype(np.int64) - n
    known = value < len(terminal)
    bad[final] = ~known | ~np.isin(tokens[final], eos)
    bad[final[known]] |= terminal[value[known]] != sources[final[known]]
    edge = np.flatnonzero(dests[: len(sources)] < n)
    token = tokens[edge].astype(np.int64)
    known = (token >= 0) & (token < len(lengths))
    left = np.where(known, lengths[np.where(known, token, 0)], 0).astype(np.int64)
    bad[edge[left <= 0]] = True
    keep = left > 0
    edge, at, left = edge[keep], dests[edge[keep]].astype(np.int64), left[keep]
    position = token_offsets[token[keep]] + left - 1  # the token's last byte: the edge into `at`
    while len(edge):
        wrong = (at <= 0) | (byte[np.maximum(at, 0)] != raw[position])
        bad[edge[wrong]] = True
        at, position, left = parent[np.maximum(at, 0)].astype(np.int64), position - 1, left - 1
        done = left == 0
        bad[edge[done & ~wrong & (at != sources[edge])]] = True
        more = ~done & ~wrong
        edge, at, position, left = edge[more], at[more], position[more], left[more]
    found = np.flatnonzero(bad)
    return int(found[0]) if len(found) else -1


def utf8_steps() -> npt.NDArray[np.uint16]:
    """The table of :func:`_spells_utf8` (built once)."""
    global _UTF8_STEPS
    if _UTF8_STEPS is None:
        _UTF8_STEPS = _utf8_steps()
    return _UTF8_STEPS


def _stored_arguments(cls: type[TrieAutomaton], arrays: dict[str, Any]) -> dict[str, Any]:
    """The constructor's array arguments from a file's arrays (the derived ones if there)."""
    found = {name: arrays[name] for name in cls._ARRAYS}
    found.update({name: arrays[name] for name in cls._DERIVED if name in arrays})
    return found


def _meta_arguments(meta: dict[str, Any]) -> dict[str, Any]:
    arguments = dict(meta)
    arguments["eos_token_ids"] = tuple(arguments["eos_token_ids"])
    return arguments


_KINDS: dict[str, type[TrieAutomaton]] = {"trie": TrieAutomaton}


def register_kind(cls: type[TrieAutomaton]) -> type[TrieAutomaton]:
    """Let files of ``cls._kind`` load as ``cls`` (each layout registers itself)."""
    _KINDS[cls._kind] = cls
    return cls


def restore_stored(stored: _storage.Stored, vocab: Any = None, *, check_edges: bool = True) -> TrieAutomaton:
    """The automaton a file holds, its fields checked against ``vocab`` when given (its
    fingerprint is :meth:`TrieAutomaton.load`'s check), and with ``check_edges`` its edges
    against its values."""
    header = stored.header
    return restore_parts(
        stored.kind,
        stored.meta,
        stored.arrays,
        vocab_fingerprint=header["vocab_fingerprint"],
        source=stored.source,
        vocab=vocab,
        check_edges=check_edges,
    )


def restore_parts(
    kind: Any,
    meta: Any,
    arrays: dict[str, Any],
    *,
    vocab_fingerprint: str,
    source: str,
    field: str = "arrays",
    vocab: Any = None,
    check_edges: bool = True,
) -> TrieAutomaton:
    """The automaton of :meth:`TrieAutomaton.file_parts`, checked: raises AutomatonFileError
    (``.field``: ``field``, or the field at fault) when the parts name another vocabulary
    (or disagree with ``vocab``), or do not form an automaton."""
    if not isinstance(meta, dict) or meta.get("vocab_fingerprint") != vocab_fingerprint:
        raise AutomatonFileError(
            f"{source} is corrupt: its fields name another vocabulary than its header", field="header"
        )
    try:
        _check_meta(meta, vocab)
        held = _KINDS[kind]
        automaton = held._from_stored(meta, arrays, vocab)  # every array in bounds first
        if vocab is not None and check_edges:
            held._check_edges(arrays, vocab)
        return automaton
    except AutomatonFileError as error:  # named by the field at fault (within ``field`` for a part of a file)
        where = error.field if field == "arrays" else f"{field}.{error.field}"
        raise AutomatonFileError(f"{source} is corrupt: {error}", field=where) from None
    except (KeyError, TypeError, ValueError) as error:  # a field missing, or arrays that do not fit together
        raise AutomatonFileError(
            f"{source} is corrupt: its arrays do not form an automaton ({type(error).__name__}: {error})", field=field
        ) from None


def _from_bytes(blob: bytes) -> TrieAutomaton:
    return restore_stored(_storage.read(blob, kinds=tuple(_KINDS)))


class DagAutomaton(TrieAutomaton):
    """The compiled form of a finite *language* (a regex, a format, a set) for one vocabulary.

    Create one with :meth:`triemask.Compiler.compile_regex`,
    :meth:`~triemask.Compiler.compile_format` or ``compile(values, layout="dag")``.
    It has the decoding interface of a :class:`TrieAutomaton` (and is one, for every
    adapter and batch API), but its
    nodes are the states of the language's minimal acyclic byte automaton, not of a
    trie: a node may be reached by many strings (``2024-01-`` and ``1999-12-`` end
    at one node of ``date``), so a state does not determine the text. The text is
    read from the tokens instead: :meth:`spell`, or :attr:`triemask.Matcher.value`.

    States: ``0 .. num_nodes - 1`` are nodes (0 is the start), ``num_nodes + j`` is
    the final state reached by EOS from the ``j``-th accepting node, DEAD is -1.
    ``num_values`` is the number of strings in the language (a Python int: a UUID
    has 22**32 spellings), ``value(i)`` the ``i``-th of them in byte order.
    """

    __slots__ = ("_counts", "_dag", "_out_edges", "_pattern", "_spell_flat", "_spell_ids", "_spell_offsets")

    def __init__(
        self,
        *,
        dag: Any,
        pattern: str | None,
        spell_ids: npt.NDArray[np.int32],
        spell_offsets: npt.NDArray[np.int64],
        spell_flat: npt.NDArray[np.uint8],
        **arrays: Any,
    ) -> None:
        super().__init__(**arrays)
        self._dag = dag
        self._pattern = pattern
        self._spell_ids = spell_ids
        self._spell_offsets = spell_offsets
        self._spell_flat = spell_flat
        for array in (spell_ids, spell_offsets, spell_flat):
            array.flags.writeable = False
        # computed on first use (value counts and indexing only): idempotent, so thread-safe
        self._counts: list[int] | None = None
        self._out_edges: list[list[tuple[int, int]]] | None = None

    _kind: ClassVar[str] = "dag"
    _DAG_ARRAYS: ClassVar[tuple[str, ...]] = ("in_offsets", "source", "byte", "dest", "accepting", "level_offsets")

    def _meta(self) -> dict[str, Any]:
        return {**super()._meta(), "pattern": self._pattern}

    def _stored_arrays(self) -> dict[str, npt.NDArray[Any]]:
        arrays = super()._stored_arrays()
        arrays.update(spell_ids=self._spell_ids, spell_offsets=self._spell_offsets, spell_flat=self._spell_flat)
        arrays.update({f"dag_{name}": getattr(self._dag, name) for name in self._DAG_ARRAYS})
        return arrays

    @classmethod
    def _check_stored(cls, meta: dict[str, Any], arrays: dict[str, Any], vocab: Any = None) -> None:
        super()._check_stored(meta, arrays, vocab)
        for name in ("spell_ids", "spell_offsets", "spell_flat", *(f"dag_{name}" for name in cls._DAG_ARRAYS)):
            expect_dtype(arrays, name, _STORED_DTYPES[name])
        spell_ids, spell_offsets = arrays["spell_ids"], arrays["spell_offsets"]
        expect_within(spell_ids, 0, meta["vocab_size"], "spell_ids")
        if (np.diff(spell_ids) <= 0).any() or len(spell_offsets) != len(spell_ids) + 1:
            raise AutomatonFileError("spelled tokens not ascending, or not one offset each", field="spell_ids")
        if int(spell_offsets[0]) != 0 or (np.diff(spell_offsets) < 0).any():
            raise AutomatonFileError("spelling offsets out of order", field="spell_offsets")
        if int(spell_offsets[-1]) != len(arrays["spell_flat"]):
            raise AutomatonFileError("spelling offsets past the spelled bytes", field="spell_offsets")
        # the byte DAG, which value(), values() and num_values walk: in bounds and acyclic
        num_nodes = len(arrays["edge_offsets"]) - 2
        source, dest, levels = arrays["dag_source"], arrays["dag_dest"], arrays["dag_level_offsets"]
        if len(source) != len(dest) or len(arrays["dag_byte"]) != len(source):
            raise AutomatonFileError("byte edges of unequal lengths", field="dag_source")
        expect_within(source, 0, num_nodes, "dag_source")
        expect_within(dest, 0, num_nodes, "dag_dest")
        expect_within(arrays["dag_accepting"], 0, num_nodes, "dag_accepting")
        if not np.array_equal(arrays["dag_accepting"], arrays["terminal_nodes"]):
            raise AutomatonFileError("accepting nodes that are not the terminal nodes", field="dag_accepting")
        in_offsets = arrays["dag_in_offsets"]
        if (
            len(in_offsets) != num_nodes + 1
            or int(in_offsets[0]) != 0
            or (np.diff(in_offsets) < 0).any()
            or int(in_offsets[-1]) != len(dest)
            or (np.diff(dest.astype(np.int64)) < 0).any()
        ):
            raise AutomatonFileError("byte edges not grouped by destination", field="dag_in_offsets")
        if not np.array_equal(levels, arrays["level_offsets"]):
            raise AutomatonFileError("byte levels that are not the automaton's", field="dag_level_offsets")
        level = np.searchsorted(levels, np.arange(num_nodes), side="right") - 1
        if (level[dest] <= level[source]).any():
            raise AutomatonFileError("a byte edge that does not lead one level down (a cycle)", field="dag_dest")
        if not _spells_utf8(source, arrays["dag_byte"], dest, levels, arrays["dag_accepting"]):  # a DAG spells str
            raise AutomatonFileError("byte edges that spell strings which are not UTF-8", field="dag_byte")

    @classmethod
    def _check_edges(cls, arrays: dict[str, Any], vocab: Any) -> None:
        """(A DAG's token edges are checked to lead down its levels in :meth:`_check_stored`.)"""

    @classmethod
    def _from_stored(cls, meta: dict[str, Any], arrays: dict[str, Any], vocab: Any = None) -> DagAutomaton:
        from ._regex import ByteDag

        cls._check_stored(meta, arrays, vocab)
        dag = ByteDag(**{name: arrays[f"dag_{name}"] for name in cls._DAG_ARRAYS})
        return cls(
            dag=dag,
            spell_ids=arrays["spell_ids"],
            spell_offsets=arrays["spell_offsets"],
            spell_flat=arrays["spell_flat"],
            **_stored_arguments(cls, arrays),
            **_meta_arguments(meta),
        )

    @property
    def set_fingerprint(self) -> str:
        """Fingerprint of the language: of its minimal DAG (canonical for the language)."""
        if self._set_fingerprint is None:
            digest = hashlib.blake2b(b"dag", digest_size=16)
            for name in self._DAG_ARRAYS:
                digest.update(np.ascontiguousarray(getattr(self._dag, name)).tobytes())
            self._set_fingerprint = digest.hexdigest()
        return self._set_fingerprint

    def _arrays(self) -> list[npt.NDArray[Any]]:
        if not hasattr(self, "_dag"):  # called by the base constructor, before these are set
            return super()._arrays()
        dag = self._dag
        return [
            *super()._arrays(),
            self._spell_ids,
            self._spell_offsets,
            self._spell_flat,
            dag.in_offsets,
            dag.source,
            dag.byte,
            dag.dest,
            dag.accepting,
        ]

    @property
    def pattern(self) -> str | None:
        """The regular expression this automaton was compiled from (None for a set
        compiled with ``layout="dag"``)."""
        return self._pattern

    @property
    def num_values(self) -> int:
        """Number of strings in the language (exact; may exceed any fixed-width integer)."""
        return self._path_counts()[0]

    def _path_counts(self) -> list[int]:
        if self._counts is None:
            self._counts = self._dag.path_counts()
        return self._counts

    def value_of(self, state: int) -> str | bytes | None:
        """Not available: a node of a DAG does not determine its text. Raises
        :class:`~triemask.StateError` pointing to :meth:`spell` and ``Matcher.value``."""
        self._node(state)
        raise StateError(
            "a DagAutomaton state does not determine the text (many strings reach one node): "
            "read it from the tokens with spell(token_ids) or Matcher.value"
        )

    def spell(self, token_ids: Iterable[int]) -> str | None:
        """The string ``token_ids`` spell from the initial state when it is complete
        (a member of the language), else None; an EOS and what follows it are ignored."""
        if not isinstance(token_ids, Iterable) or isinstance(token_ids, str | bytes):
            raise ArgumentTypeError(
                f"token_ids must be an iterable of integers, got {type(token_ids).__name__} {token_ids!r:.40}"
            )
        state = 0
        pieces: list[bytes] = []
        ids = self._spell_ids
        for token in token_ids:
            if self.is_final(state):
                break
            following = self.next_state(state, token)
            if following == DEAD:
                return None
            if following < self._num_nodes:  # a text token (EOS leads to a final state)
                i = int(np.searchsorted(ids, token))
                pieces.append(self._spell_flat[self._spell_offsets[i] : self._spell_offsets[i + 1]].tobytes())
            state = following
        if not self.is_accepting(state):
            return None
        return b"".join(pieces).decode("utf-8")

    def value(self, index: int) -> str:
        """The ``index``-th string of the language in byte order (computed by walking
        the automaton with its path counts, not by enumerating)."""
        if type(index) is not int:
            index = state_index(index, "value indices")
        counts = self._path_counts()
        if not 0 <= index < counts[0]:
            raise ValueIndexError(f"value index {index} is outside [0, {counts[0]})")
        if self._out_edges is None:
            self._out_edges = self._dag.out_edges()
        out = self._out_edges
        accepting = set(self._dag.accepting.tolist())
        node, spelled = 0, bytearray()
        while True:
            if node in accepting:
                if index == 0:
                    return spelled.decode("utf-8")
                index -= 1
            for byte, child in out[node]:
                if index < counts[child]:
                    spelled.append(byte)
                    node = child
                    break
                index -= counts[child]

    def values(self) -> list[str | bytes]:
        """Every string of the language, in byte order (refused above a million)."""
        if self.num_values > 1_000_000:
            raise ValueSetError(
                f"the language of {self._pattern or 'this set'!r:.80} has {self.num_values} strings; "
                "enumerate a range of value(i) instead"
            )
        return [self.value(i) for i in range(self.num_values)]

    def is_accepting(self, state: int) -> bool:
        """Whether the tokens so far spell a complete string of the language (true in
        final states too)."""
        node = self._node(state)
        if node == self._num_nodes:
            return state != DEAD
        i = int(np.searchsorted(self._terminal_nodes, np.int32(node)))  # an int32 key: no cast of the array
        return i < len(self._terminal_nodes) and int(self._terminal_nodes[i]) == node

    def stats(self) -> dict[str, Any]:
        """Structure of the automaton: nodes, edges and allowed tokens by level (the
        longest distance from the start, in bytes)."""
        base = super().stats()
        for key in ("duplicates_collapsed", "value_bytes", "trie_nodes", "prefix_sharing_ratio"):
            del base[key]
        base["values"] = self.num_values
        base["pattern"] = self._pattern
        base["dag_nodes"] = self._num_nodes
        base["dag_edges"] = self._dag.num_edges
        base["accepting_nodes"] = len(self._terminal_nodes)
        return base

    def __repr__(self) -> str:
        return (
            f"DagAutomaton(pattern={self._pattern!r:.60}, nodes={self._num_nodes}, "
            f"edges={int(self._edge_offsets[-1])}, eos={self._eos}, memory_bytes={self.memory_bytes})"
        )


register_kind(DagAutomaton)
