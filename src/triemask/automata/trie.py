"""The compiled automaton: flat arrays, integer states, stateless lookups."""

from __future__ import annotations

import os
import weakref
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from itertools import pairwise
from typing import Any, ClassVar, TypeVar, cast

import numpy as np
import numpy.typing as npt

from ..base import (
    INT32,
    ArgumentTypeError,
    AutomatonFileError,
    StateError,
    ValueIndexError,
    as_bitmask_array,
    bitmask_width,
    integer,
    kernels,
    kind_class,
    kinds_of,
    register_kind,
    set_fingerprint,
    sorted_unique,
    storage,
)
from ..vocab import Vocabulary
from .checks import (
    STORED_DTYPES,
    check_edges_spell_values,
    check_meta,
    expect_dtype,
    expect_within,
    stored_arguments,
)
from .core import (
    DEAD,
    ROW_BY_ROW,
    AutomatonBase,
    AutomatonMeta,
    IntArray,
    count_states,
    count_words,
    dense_rows,
    dense_threshold,
    kernel_fill,
    kernel_next_states,
    kernel_pairs,
    set_bits,
    state_index,
)
from .forced import TrieChains

_Automaton = TypeVar("_Automaton", bound="TrieAutomaton")


class TrieAutomaton(AutomatonBase):
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
        "_compiler",
        "_dense_nodes",
        "_dense_rows",
        "_dests_view",
        "_edge_dests",
        "_edge_offsets",
        "_edge_offsets_view",
        "_edge_tokens",
        "_forced",
        "_level_offsets",
        "_meta",
        "_num_nodes",
        "_num_values",
        "_set_fingerprint",
        "_terminal_nodes",
        "_terminal_values",
        "_tokens_view",
        "_value_flat",
        "_value_starts",
        "_width",
    )

    def __init__(
        self,
        *,
        edge_offsets: npt.NDArray[np.int32],
        edge_tokens: npt.NDArray[np.int32],
        edge_dests: npt.NDArray[np.int32],
        terminal_nodes: IntArray,
        terminal_values: IntArray,
        value_flat: IntArray,
        value_starts: IntArray,
        level_offsets: IntArray,
        meta: AutomatonMeta,
        dense_nodes: npt.NDArray[np.int32] | None = None,
        compiler: Any = None,
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
        self._level_offsets = level_offsets
        self._meta = meta
        self._width = bitmask_width(meta.vocab_size)
        self._compiler = None if compiler is None else weakref.ref(compiler)
        self._set_fingerprint: str | None = None  # computed on first use
        self._forced: TrieChains | None = None  # built on the first find_jump_forward_string
        # the rows of the nodes allowing half a row's worth of tokens, derived (the nodes are
        # saved, the rows never)
        self._dense_nodes, self._dense_rows = dense_rows(
            edge_tokens, edge_offsets, self._num_nodes, self._width, dense_nodes
        )
        for array in self._arrays():
            array.flags.writeable = False
        # memoryviews give the per-step paths Python ints without numpy scalar overhead.
        self._edge_offsets_view = edge_offsets.data
        self._tokens_view = edge_tokens.data
        self._dests_view = edge_dests.data
        self._kernel: Any = None
        native = kernels.KERNELS
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

    def _file_meta(self) -> dict[str, Any]:
        """The scalar fields a file stores (JSON), besides the arrays."""
        return self._meta.to_file()

    def _stored_arrays(self) -> dict[str, npt.NDArray[Any]]:
        return {name: getattr(self, f"_{name}") for name in (*self._ARRAYS, *self._DERIVED)}

    @classmethod
    def _from_stored(
        cls: type[_Automaton], meta: dict[str, Any], arrays: dict[str, Any], vocab: Any = None
    ) -> _Automaton:
        cls._check_stored(meta, arrays, vocab)
        return cls(**stored_arguments(cls, arrays), meta=AutomatonMeta.from_file(meta))

    @classmethod
    def _check_edges(cls, arrays: dict[str, Any], vocab: Any) -> None:
        """That the edges are those of the values (:func:`check_edges_spell_values`); a layout
        whose edges are not a trie's checks what it can in :meth:`_check_stored`."""
        check_edges_spell_values(arrays, vocab)

    @classmethod
    def _check_stored(cls, meta: dict[str, Any], arrays: dict[str, Any], vocab: Any = None) -> None:
        """Check a file's arrays before anything is built from them: dtypes, bounds, order,
        and what later reads trust (terminal and value arrays, UTF-8 values, edges that go
        one level down at least, so no walk loops). Raises AutomatonFileError naming the array.
        ``vocab``: the vocabulary it is loaded for (its scalar fields are checked before)."""
        for name in cls._ARRAYS:
            expect_dtype(arrays, name, STORED_DTYPES[name])
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
            self._set_fingerprint = set_fingerprint(flat, self._value_starts, self._meta.values_are_str)
        return self._set_fingerprint

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the automaton to ``path`` in triemask's file format (no pickle): versioned,
        with the vocabulary's and the set's fingerprints, every array aligned and checksummed,
        written atomically. Load it with :meth:`load`."""
        kind, meta, arrays = self.file_parts()
        storage.write(
            path,
            kind,
            meta,
            arrays,
            vocab_fingerprint=self._meta.vocab_fingerprint,
            set_fingerprint=self.set_fingerprint,
        )

    def file_parts(self) -> tuple[str, dict[str, Any], dict[str, npt.NDArray[Any]]]:
        """What triemask's file format stores of this automaton: its kind, its scalar fields
        and its arrays (:meth:`save` writes them; a compiled schema stores its fields' automata
        this way, and :func:`restore_parts` makes the automaton again)."""
        return self._kind, self._file_meta(), self._stored_arrays()

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

        if not isinstance(vocab, Vocabulary):
            raise ArgumentTypeError(f"load needs vocab=<the triemask.Vocabulary>, got {type(vocab).__qualname__}")

        def build(stored: storage.Stored) -> _Automaton:
            held = kind_class(stored.kind, stored.source)
            if not issubclass(held, cls):
                raise AutomatonFileError(f"{stored.source} holds a {held.__name__}, not a {cls.__name__}", field="kind")
            # an instance of `held`, a subclass of cls; with verify, its edges checked against its values
            return cast(_Automaton, restore_stored(stored, vocab, check_edges=verify))

        return storage.load(
            path,
            kinds=kinds_of(TrieAutomaton),
            vocab_fingerprint=vocab.fingerprint,
            build=build,
            use_mmap=mmap,
            verify=verify,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # pickling goes through the file format: versioned, checked, no pickled internals
        kind, meta, arrays = self.file_parts()
        blob = storage.to_bytes(
            kind, meta, arrays, vocab_fingerprint=self._meta.vocab_fingerprint, set_fingerprint=self.set_fingerprint
        )
        return (automaton_from_bytes, (blob,))

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
    def meta(self) -> AutomatonMeta:
        """The vocabulary it was compiled for, EOS, the values' type and the compile's record."""
        return self._meta

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
        return self._meta.vocab_size

    @property
    def vocab_fingerprint(self) -> str:
        """Fingerprint of the vocabulary this automaton was compiled for."""
        return self._meta.vocab_fingerprint

    @property
    def eos(self) -> bool:
        """Whether EOS ends a complete value (``compile(..., eos=True)``)."""
        return self._meta.eos

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """EOS ids allowed after a complete value (empty when ``eos`` is False)."""
        return self._meta.eos_token_ids if self._meta.eos else ()

    @property
    def accepting_nodes(self) -> npt.NDArray[np.int32]:
        """The trie nodes where a value is complete, ascending (read-only); the value
        of ``accepting_nodes[i]`` is not in general ``value(i)``: use :meth:`value_of`."""
        return sorted_unique(self._terminal_nodes).astype(np.int32)

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

    def forced_bytes(self, state: int) -> bytes:
        """The bytes every continuation from ``state`` begins with (jump-forward decoding:
        :meth:`triemask.Matcher.find_jump_forward_string`); ``b""`` where a value may end, the
        next byte is open, or in a final or DEAD state. The first call builds the trie's
        forced chains (five bytes a node, :meth:`stats`' ``forced_nodes``)."""
        node = self._node(state)
        return b"" if node == self._num_nodes else self._trie_chains().chains.forced(node)

    def _forced_nodes(self) -> int:
        """How many nodes force their next byte (one edge, no value ending there)."""
        return self._trie_chains().chains.forced_nodes

    def _prefix(self, node: int) -> bytes:
        """The bytes that spell trie node ``node``."""
        return self._trie_chains().prefix(node)

    def _trie_chains(self) -> TrieChains:
        found = self._forced
        if found is None:  # (two threads may both build it: the same arrays, either kept)
            found = self._forced = TrieChains.of_values(self._value_flat, self._value_starts, self._num_nodes)
        return found

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
        pairs = kernel_pairs(self._kernel, states)
        if pairs is not None:
            return pairs
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
        found = kernel_next_states(self._kernel, states, token_ids)
        if found is not None:
            return found
        if (
            isinstance(states, list | tuple | np.ndarray)
            and isinstance(token_ids, list | tuple | np.ndarray)
            and len(states) == len(token_ids) <= ROW_BY_ROW
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
        return self._meta.values_are_str

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
            The compiler of this automaton's vocabulary; by default the one that compiled
            it, while it is alive (an automaton loaded from a file or a pickle needs one).
        """
        if compiler is None:
            compiler = self._compiler() if self._compiler is not None else None
            if compiler is None:
                raise ArgumentTypeError(
                    f"with_values needs the Compiler of the automaton's vocabulary ({self._meta.vocab_fingerprint}) "
                    "and the one that compiled it is gone (or it was loaded): pass compiler=Compiler(vocab)"
                )
        return cast(TrieAutomaton, compiler.with_values(self, added, removed))

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
        return raw.decode("utf-8") if self._meta.values_are_str else raw

    def values(self) -> list[str | bytes]:
        """All distinct values, in sorted (UTF-8 byte) order."""
        data, bounds = self._value_flat.tobytes(), self._value_starts.tolist()  # (one copy, not one a value)
        if self._meta.values_are_str:
            return [data[a:b].decode("utf-8") for a, b in pairwise(bounds)]
        return [data[a:b] for a, b in pairwise(bounds)]

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

    def terminal_arrays(self) -> tuple[IntArray, IntArray]:
        """Where the values end, read-only: ``(nodes, values)``, node ``nodes[i]`` (ascending)
        completing the value of index ``values[i]``. For updates (``with_values``)."""
        return self._terminal_nodes, self._terminal_values

    def _csr(self, nodes: npt.NDArray[np.int64]) -> tuple[IntArray, IntArray, IntArray, IntArray]:
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
        if kernel_fill(self._kernel, bitmask, states, rows, self._meta.vocab_size):
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
        array = as_bitmask_array(bitmask, self._meta.vocab_size)
        if count_states(states) <= ROW_BY_ROW:  # a few rows: numpy call overhead dominates
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
        array = as_bitmask_array(bitmask, self._meta.vocab_size)
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
        total bytes of the distinct values; ``forced_nodes`` the nodes whose next byte is
        forced (one child, no value ending there: what jump-forward decoding skips; counting
        them builds :meth:`forced_bytes`' table, ten bytes a node); ``valid_by_depth`` gives, for each
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
            "duplicates_collapsed": self._meta.input_values - self._num_values,
            "value_bytes": value_bytes,
            "trie_nodes": n - 1,
            "prefix_sharing_ratio": (n - 1) / value_bytes if value_bytes else 0.0,
            "max_depth": len(self._level_offsets) - 2,
            "states": self.num_states,
            "edges": int(self._edge_offsets[-1]),
            "mask_words": count_words(self._edge_tokens, self._edge_offsets[: n + 1]),
            "rows_stored_whole": len(self._dense_nodes),
            "forced_nodes": self._forced_nodes(),
            "memory_bytes": self.memory_bytes,
            "compile_seconds": self._meta.compile_seconds,
            "eos": self._meta.eos,
            "eos_token_ids": list(self.eos_token_ids),
            "vocab_size": self._meta.vocab_size,
            "vocab_fingerprint": self._meta.vocab_fingerprint,
            "valid_by_depth": by_depth,
        }

    def __repr__(self) -> str:
        return (
            f"TrieAutomaton(values={self._num_values}, nodes={self._num_nodes}, "
            f"edges={int(self._edge_offsets[-1])}, eos={self._meta.eos}, memory_bytes={self.memory_bytes})"
        )


def native_kernel(automaton: TrieAutomaton) -> Any:
    """The automaton's C kernel (``next``, ``fill``, ``fill_batch``, ``next_batch``: each
    returns None to defer to the reference), or None without the extension. For the
    per-request matcher, whose step calls it directly."""
    return automaton._kernel


def restore_stored(stored: storage.Stored, vocab: Any = None, *, check_edges: bool = True) -> TrieAutomaton:
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
        check_meta(meta, vocab)
        held = kind_class(kind if isinstance(kind, str) else repr(kind), source)
        if not issubclass(held, TrieAutomaton):
            raise AutomatonFileError(f"its kind {kind!r} is not an automaton's", field="kind")
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


def automaton_from_bytes(blob: bytes) -> TrieAutomaton:
    """The automaton of a pickle (:meth:`TrieAutomaton.__reduce__`: the file format's bytes)."""
    return restore_stored(storage.read(blob, kinds=kinds_of(TrieAutomaton)))


register_kind("trie", TrieAutomaton)
