"""The lazy layout: a :class:`TrieAutomaton` that stores the value trie, not its edges.

``compile(values, layout="lazy")`` keeps, per trie node, one ``uint16`` word (number of
children, whether a value ends there, whether no token sequence completes a value from
there) and its byte; first-child ids and terminal ranks are sampled every 64 nodes. A
node's edges are found on first use by walking its subtrie together with the
vocabulary's forward token trie (:class:`~triemask.vocab.token_index.TokenTrie`): token ``t``
is allowed at node ``a`` exactly when ``bytes(t)`` spells a path down from ``a``, and
leads where that path ends, which is the compiler's definition, so the masks and states
equal the eager layout's. Found edges (and the whole row for nodes allowing half a row's
worth of tokens) go to a byte-bounded LRU cache; a step at a cached node costs what an
eager step does. Memory: about 5 bytes per trie node and 8 per value, plus the cache
bound: 6-9x less than the eager layout on large sets (docs/large-sets.md).

The C extension holds the cache (``_native.lazy_kernel``); without it, the NumPy code
below finds the edges (level by level) and a Python LRU keeps them.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from ..base import (
    ArgumentTypeError,
    AutomatonFileError,
    BoundedLRU,
    ValueIndexError,
    bitmask_width,
    kernels,
    register_kind,
)
from ..vocab import TokenTrie, token_trie_of
from .checks import expect_dtype, utf8_steps
from .core import DEAD, AutomatonMeta, dense_threshold, set_bits, state_index
from .trie import TrieAutomaton

DEFAULT_CACHE_BYTES = 8 << 20
"""The lazy layout's default cache bound: a few thousand hot rows of a 150K vocabulary,
or about a hundred thousand narrow nodes."""

LAZY_COUNT = 0x1FF  # node word bits 0-8: number of children
LAZY_DEAD = 0x4000  # no token sequence completes a value from this node: no edge leads here
LAZY_TERMINAL = 0x8000  # a value ends here
LAZY_BLOCK = 64  # first-child ids and terminal ranks are sampled every LAZY_BLOCK nodes
_STORED_DTYPES = {
    "node_byte": np.uint8,
    "node_word": np.uint16,
    "child_blocks": np.int32,
    "terminal_blocks": np.int32,
    "terminal_values": np.int32,
    "value_nodes": np.int32,
    "level_offsets": np.int64,
    "token_children": np.int32,
    "token_node_byte": np.uint8,
    "token_token_offsets": np.int32,
    "token_token_ids": np.int32,
}
_ENTRY_BYTES = 64  # what a cached node costs besides its edges (the C cache's header)
_CHUNK = 8192  # frontier pairs expanded at once by the NumPy reference


class LazyTrieAutomaton(TrieAutomaton):
    """A :class:`TrieAutomaton` whose edges are found on first use and cached
    (``compile(values, layout="lazy")``).

    The same states, masks and methods as the eager layout, for 6-9x less memory on large
    sets; the first step at a node costs a walk of its subtrie against the token trie
    (microseconds deep in the trie, up to a few milliseconds at the root of a word list),
    later steps what an eager step costs while the node stays cached. The cache is
    bounded by ``cache_bytes``, shared by every request and thread using the automaton
    (thread-safe), and reported by :meth:`cache_info`; a node's edges larger than the
    whole bound are built for the call and not kept.

    ``memory_bytes`` counts the trie arrays and the cache's current bytes; the token trie
    is the vocabulary's, shared by every lazy automaton compiled with the same
    :class:`~triemask.Compiler` (``stats()["token_trie_bytes"]``).
    """

    __slots__ = (
        "_cache",
        "_cache_lock",
        "_child_blocks",
        "_node_byte",
        "_node_word",
        "_terminal_blocks",
        "_token_keys",
        "_token_trie",
        "_value_nodes",
    )

    def __init__(
        self,
        *,
        node_byte: npt.NDArray[np.uint8],
        node_word: npt.NDArray[np.uint16],
        child_blocks: npt.NDArray[np.int32],
        terminal_blocks: npt.NDArray[np.int32],
        terminal_values: npt.NDArray[np.int32],
        value_nodes: npt.NDArray[np.int32],
        token_trie: TokenTrie,
        cache_bytes: int,
        set_fingerprint: str | None,
        level_offsets: npt.NDArray[np.int64],
        meta: AutomatonMeta,
        compiler: Any = None,
    ) -> None:
        self._num_nodes = len(node_word)
        self._num_values = len(value_nodes)
        self._node_byte = node_byte
        self._node_word = node_word
        self._child_blocks = child_blocks
        self._terminal_blocks = terminal_blocks
        self._terminal_values = terminal_values
        self._value_nodes = value_nodes
        self._token_trie = token_trie
        self._level_offsets = level_offsets
        self._meta = meta
        self._width = bitmask_width(meta.vocab_size)
        self._compiler = None if compiler is None else weakref.ref(compiler)
        self._set_fingerprint = set_fingerprint
        self._forced = None  # (the eager layout's table; this layout walks instead)
        self._dense_nodes = np.zeros(0, dtype=np.int32)  # no rows stored whole: the cache holds them
        for array in self._arrays():
            array.flags.writeable = False
        self._token_keys: npt.NDArray[np.int64] | None = None  # the NumPy reference's child keys
        self._cache: BoundedLRU[int, tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]] = BoundedLRU(cache_bytes)
        self._cache_lock = threading.Lock()
        self._kernel: Any = None
        native = kernels.KERNELS
        if native is not None:  # the cache and every per-step and batch loop in C
            self._kernel = native.lazy_kernel(
                node_byte,
                node_word,
                child_blocks,
                terminal_blocks,
                terminal_values,
                token_trie.native_tables(self._width),
                np.asarray(self.eos_token_ids, dtype=np.int32),
                self._num_nodes,
                self._num_nodes + self._num_values,
                self._width,
                dense_threshold(self._width),
                cache_bytes,
                self._native_slots(),
            )

    _kind: ClassVar[str] = "lazy"
    _ARRAYS: ClassVar[tuple[str, ...]] = (
        "node_byte",
        "node_word",
        "child_blocks",
        "terminal_blocks",
        "terminal_values",
        "value_nodes",
        "level_offsets",
    )
    _DERIVED: ClassVar[tuple[str, ...]] = ()
    _TOKEN_ARRAYS: ClassVar[tuple[str, ...]] = ("children", "node_byte", "token_offsets", "token_ids")

    def _file_meta(self) -> dict[str, Any]:
        return {**super()._file_meta(), "cache_bytes": self._cache.limit, "set_fingerprint": self._set_fingerprint}

    def _stored_arrays(self) -> dict[str, npt.NDArray[Any]]:
        arrays = super()._stored_arrays()
        arrays.update({f"token_{name}": getattr(self._token_trie, name) for name in self._TOKEN_ARRAYS})
        return arrays

    @classmethod
    def _check_stored(cls, meta: dict[str, Any], arrays: dict[str, Any], vocab: Any = None) -> None:
        """The trie the node words describe, checked against every array that indexes it
        (first-child and terminal samples, value maps, levels, byte order of children, UTF-8
        values), and the token trie against the vocabulary's when it is given."""
        for name, dtype in _STORED_DTYPES.items():
            expect_dtype(arrays, name, dtype)
        node_byte, words, levels = arrays["node_byte"], arrays["node_word"], arrays["level_offsets"]
        n = len(node_byte)
        counts = (words & LAZY_COUNT).astype(np.int64)
        if (
            n < 1
            or len(words) != n
            or (words & ~np.uint16(LAZY_COUNT | LAZY_DEAD | LAZY_TERMINAL)).any()
            or (counts > 256).any()
        ):
            raise AutomatonFileError("node words that do not describe a trie", field="node_word")
        if int(counts.sum()) != n - 1:
            raise AutomatonFileError("child counts that do not add up to the nodes", field="node_word")
        parent = np.zeros(n, dtype=np.int64)
        parent[1:] = np.repeat(np.arange(n), counts)  # breadth-first: children contiguous, after their parent
        if (parent[1:] >= np.arange(1, n)).any():
            raise AutomatonFileError("a node that is not after its parent", field="node_word")
        same = parent[2:] == parent[1:-1]
        if (node_byte[2:][same] <= node_byte[1:-1][same]).any():
            raise AutomatonFileError("children that are not in ascending byte order", field="node_byte")
        starts = np.arange(0, n, LAZY_BLOCK)
        expected = np.ones(len(starts) + 1, dtype=np.int64)
        np.cumsum(np.add.reduceat(counts, starts), out=expected[1:])
        expected[1:] += 1
        if not np.array_equal(arrays["child_blocks"], expected):
            raise AutomatonFileError("first-child samples that are not the trie's", field="child_blocks")
        terminal = (words & LAZY_TERMINAL) != 0
        ranks = np.zeros(len(starts) + 1, dtype=np.int64)
        np.cumsum(np.add.reduceat(terminal.view(np.uint8), starts, dtype=np.int64), out=ranks[1:])
        if not np.array_equal(arrays["terminal_blocks"], ranks):
            raise AutomatonFileError("terminal samples that are not the trie's", field="terminal_blocks")
        terminal_nodes = np.flatnonzero(terminal)
        values, nodes = arrays["terminal_values"], arrays["value_nodes"]
        if len(values) != len(terminal_nodes) or len(nodes) != len(terminal_nodes):
            raise AutomatonFileError("not one value per terminal node", field="terminal_values")
        if not np.array_equal(np.sort(values), np.arange(len(values))):
            raise AutomatonFileError("terminal values that are not the values' indices", field="terminal_values")
        if not np.array_equal(nodes[values], terminal_nodes):
            raise AutomatonFileError("value nodes that are not the terminal nodes", field="value_nodes")
        expected_levels = [0, 1]
        while expected_levels[-1] > expected_levels[-2]:
            expected_levels.append(1 + int(counts[: expected_levels[-1]].sum()))
        if not np.array_equal(levels, np.array(expected_levels[:-1], dtype=np.int64)):
            raise AutomatonFileError("level offsets that are not the trie's levels", field="level_offsets")
        if meta["values_are_str"]:  # every value spells UTF-8: decoder states down the trie, level by level
            steps, state = utf8_steps(), np.ones(n, dtype=np.uint16)
            for low, high in zip(levels[1:-1].tolist(), levels[2:].tolist(), strict=True):
                state[low:high] = steps[state[parent[low:high]], node_byte[low:high]]
            if (state & 0x100).any() or (state[terminal_nodes] != 1).any():
                raise AutomatonFileError("values that are not UTF-8", field="node_byte")
        if vocab is not None:
            fresh = token_trie_of(vocab)
            for name in cls._TOKEN_ARRAYS:
                if not np.array_equal(arrays[f"token_{name}"], getattr(fresh, name)):
                    raise AutomatonFileError("a token trie that is not the vocabulary's", field=f"token_{name}")

    @classmethod
    def _check_edges(cls, arrays: dict[str, Any], vocab: Any) -> None:
        """(No edges are stored: they are found from the trie and the vocabulary's token trie,
        both checked in :meth:`_check_stored`.)"""

    @classmethod
    def _from_stored(cls, meta: dict[str, Any], arrays: dict[str, Any], vocab: Any = None) -> LazyTrieAutomaton:
        cls._check_stored(meta, arrays, vocab)
        token_trie = TokenTrie(**{name: arrays[f"token_{name}"] for name in cls._TOKEN_ARRAYS})
        return cls(
            token_trie=token_trie,
            **{name: arrays[name] for name in cls._ARRAYS},
            cache_bytes=meta["cache_bytes"],
            set_fingerprint=meta["set_fingerprint"],
            meta=AutomatonMeta.from_file(meta),
        )

    def _arrays(self) -> list[npt.NDArray[Any]]:
        return [
            self._node_byte,
            self._node_word,
            self._child_blocks,
            self._terminal_blocks,
            self._terminal_values,
            self._value_nodes,
            self._level_offsets,
        ]

    @property
    def memory_bytes(self) -> int:
        """Bytes held by the trie arrays and, now, by the cache (the shared token trie excluded)."""
        return sum(a.nbytes for a in self._arrays()) + self.cache_info()["bytes"]

    @property
    def cache_bytes(self) -> int:
        """The cache's bound in bytes."""
        return self._cache.limit

    def cache_info(self) -> dict[str, int]:
        """The edge cache: ``bytes`` in use, ``limit``, ``entries`` (nodes cached), and the
        ``hits``, ``misses`` and ``evictions`` so far."""
        if self._kernel is not None:
            info: dict[str, int] = self._kernel.cache_info()
            return info
        with self._cache_lock:
            return {
                "bytes": self._cache.used,
                "limit": self._cache.limit,
                "entries": len(self._cache),
                "hits": self._cache.hits,
                "misses": self._cache.misses,
                "evictions": self._cache.evictions,
            }

    def cache_clear(self) -> None:
        """Drop every cached node (the counters stay)."""
        if self._kernel is not None:
            self._kernel.cache_clear()
        with self._cache_lock:
            self._cache.clear()

    # ------------------------------------------------------------------ edges

    def _edges(self, node: int) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """Node ``node``'s (tokens ascending, destinations), read-only, from the cache."""
        kernel = self._kernel
        if kernel is not None:
            found = kernel.edges(node)
            tokens, dests = (np.frombuffer(b, dtype=np.int32) for b in found)
            return tokens, dests
        with self._cache_lock:
            cached = self._cache.get(node)
        if cached is not None:
            return cached
        edges = self._edges_reference(node)
        with self._cache_lock:
            return self._cache.setdefault(node, edges, _ENTRY_BYTES + 8 * len(edges[0]))

    def _edges_reference(self, node: int) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """A node's edges from first principles, level by level with NumPy: the pairs
        (value-trie node, token-trie node) spelling the same bytes below ``node``."""
        trie = self._token_trie
        if self._token_keys is None:  # each token-trie node's (parent << 8 | byte), ascending
            parents = np.repeat(np.arange(len(trie.node_byte), dtype=np.int64), np.diff(trie.children))
            self._token_keys = (parents << 8) | trie.node_byte[1:]
        keys_sorted = self._token_keys
        found_tokens: list[npt.NDArray[np.int64]] = []
        found_dests: list[npt.NDArray[np.int64]] = []
        pending = [(np.array([node], dtype=np.int64), np.zeros(1, dtype=np.int64))]
        while pending:
            values, tokens_at = pending.pop()
            counts = (self._node_word[values] & LAZY_COUNT).astype(np.int64)
            total = int(counts.sum())
            if total == 0:
                continue
            owner = np.repeat(np.arange(len(values)), counts)
            child = np.repeat(self._first_children(values), counts) + (
                np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
            )
            keys = (tokens_at[owner] << 8) | self._node_byte[child]
            at = np.minimum(np.searchsorted(keys_sorted, keys), len(keys_sorted) - 1)
            hit = keys_sorted[at] == keys if len(keys_sorted) else np.zeros(len(keys), dtype=bool)
            values, tokens_at = self._slot_nodes(child[hit]), at[hit] + 1
            live = (self._node_word[values] & LAZY_DEAD) == 0
            lo = trie.token_offsets[tokens_at[live]].astype(np.int64)
            per = trie.token_offsets[tokens_at[live] + 1] - lo
            index = np.repeat(lo - (np.cumsum(per) - per), per) + np.arange(int(per.sum()))
            found_tokens.append(trie.token_ids[index].astype(np.int64))
            found_dests.append(np.repeat(values[live], per))
            pending += [  # bounded frontiers
                (values[start : start + _CHUNK], tokens_at[start : start + _CHUNK])
                for start in range(0, len(values), _CHUNK)
            ]
        eos = self.eos_token_ids
        if eos and self._node_word[node] & LAZY_TERMINAL:
            found_tokens.append(np.asarray(eos, dtype=np.int64))
            found_dests.append(np.full(len(eos), self._num_nodes + self._terminal_value(node), dtype=np.int64))
        if not found_tokens:
            return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32)
        keys = np.sort((np.concatenate(found_tokens) << 32) | np.concatenate(found_dests))
        tokens, dests = (keys >> 32).astype(np.int32), (keys & 0xFFFFFFFF).astype(np.int32)
        tokens.flags.writeable = dests.flags.writeable = False
        return tokens, dests

    def _first_children(self, nodes: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The first child of each node: its block's sample plus the counts before it."""
        result = np.empty(len(nodes), dtype=np.int64)
        offsets = np.arange(LAZY_BLOCK)
        for start in range(0, len(nodes), _CHUNK):
            part = nodes[start : start + _CHUNK]
            index = np.minimum((part & ~(LAZY_BLOCK - 1))[:, None] + offsets, self._num_nodes - 1)
            before = offsets < (part & (LAZY_BLOCK - 1))[:, None]
            within = ((self._node_word[index] & LAZY_COUNT) * before).sum(axis=1)
            result[start : start + _CHUNK] = self._child_blocks[part // LAZY_BLOCK] + within
        return result

    def forced_bytes(self, state: int) -> bytes:
        """The bytes every continuation from ``state`` begins with (see
        :meth:`TrieAutomaton.forced_bytes`), walked down the value trie's one-child nodes (no
        table: the lazy layout keeps its three bytes a node)."""
        node = self._node(state)
        forced = bytearray()
        while node < self._num_nodes and self._node_word[node] & (LAZY_TERMINAL | LAZY_COUNT) == 1:
            node = int(self._first_children(np.array([node], dtype=np.int64))[0])
            forced.append(int(self._node_byte[node]))
        return bytes(forced)

    def _slot_nodes(self, slots: Any) -> Any:
        """The nodes the out-edges ``slots`` lead to: in a trie, a child's slot is the child."""
        return slots

    def _native_slots(self) -> npt.NDArray[np.int32] | None:
        """The kernel's ``slot_dest`` (None: a trie, see :func:`_native.lazy_kernel`)."""
        return None

    def _prefix(self, node: int) -> bytes:
        spelled = bytearray()
        while node > 0:
            spelled.append(int(self._node_byte[node]))
            node = self._parent(node)
        return bytes(reversed(spelled))

    def _terminal_value(self, node: int) -> int:
        """The sorted index of the value ending at terminal node ``node``."""
        base = node & ~(LAZY_BLOCK - 1)
        rank = int(self._terminal_blocks[node // LAZY_BLOCK])
        rank += int(np.count_nonzero(self._node_word[base:node] & LAZY_TERMINAL))
        return int(self._terminal_values[rank])

    def _parent(self, node: int) -> int:
        block = int(np.searchsorted(self._child_blocks, node, side="right")) - 1
        base = block * LAZY_BLOCK
        ends = self._child_blocks[block] + np.cumsum(self._node_word[base : base + LAZY_BLOCK] & LAZY_COUNT)
        return base + int(np.searchsorted(ends, node, side="right"))

    def _csr(self, nodes: npt.NDArray[np.int64]) -> tuple[Any, Any, Any, Any]:
        unique, inverse = np.unique(nodes, return_inverse=True)
        tokens, dests, counts = [], [], []
        for node in unique.tolist():
            found = self._edges(node) if node < self._num_nodes else (np.zeros(0, np.int32),) * 2
            tokens.append(found[0])
            dests.append(found[1])
            counts.append(len(found[0]))
        ends = np.cumsum(counts, dtype=np.int64)
        first = ends - np.asarray(counts, dtype=np.int64)
        return first[inverse], ends[inverse], np.concatenate(tokens), np.concatenate(dests)

    def edge_arrays(self) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """Not available: the lazy layout stores no edges (raises ArgumentTypeError)."""
        raise ArgumentTypeError("a lazy automaton stores no edge arrays: compile the set with layout='trie'")

    def _dense_index(self, nodes: npt.NDArray[Any], counts: npt.NDArray[Any]) -> npt.NDArray[np.intp]:
        return np.full(len(nodes), -1, dtype=np.intp)

    # ------------------------------------------------------------------ per step

    def edges(self, state: int) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """The tokens allowed in ``state`` (ascending) and the state each leads to, read-only."""
        node = self._node(state)
        if node == self._num_nodes:
            return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32)
        return self._edges(node)

    def allowed_token_ids(self, state: int) -> npt.NDArray[np.int32]:
        """Ids of the tokens allowed in ``state``, ascending (EOS included when allowed),
        read-only."""
        node = self._node(state)
        if node == self._num_nodes:
            return np.zeros(0, dtype=np.int32)
        return self._edges(node)[0]

    def _next_state_reference(self, state: int, token_id: int) -> int:
        kernel = self._kernel
        if kernel is not None:
            following: int | None = kernel.next(state, token_id)
            if following is not None:
                return following
        state, token_id = state_index(state), state_index(token_id, "token ids")
        if not 0 <= state < self._num_nodes:
            self._node(state)  # raises for ids that are no state; final and DEAD allow nothing
            return DEAD
        tokens, dests = self._edges(state)
        i = int(np.searchsorted(tokens, token_id))
        return int(dests[i]) if i < len(tokens) and tokens[i] == token_id else DEAD

    def _fill_row(self, row: npt.NDArray[np.int32], state: int) -> None:
        row.fill(0)
        if not 0 <= state < self._num_nodes:
            self._node(state)  # raises for ids that are no state; final and DEAD rows are zero
            return
        allowed = self._edges(state)[0]
        set_bits(row, allowed >> 5, allowed)

    # ------------------------------------------------------------------ values

    @property
    def accepting_nodes(self) -> npt.NDArray[np.int32]:
        """The trie nodes where a value is complete, ascending (read-only)."""
        return np.flatnonzero(self._node_word & LAZY_TERMINAL).astype(np.int32)

    def value(self, index: int) -> str | bytes:
        """The ``index``-th distinct value, values in sorted (UTF-8 byte) order (spelled
        from the trie: the lazy layout does not store the values)."""
        if type(index) is not int:
            index = state_index(index, "value indices")
        if not 0 <= index < self._num_values:
            raise ValueIndexError(f"value index {index} is outside [0, {self._num_values})")
        node = int(self._value_nodes[index])
        raw: bytes | None = None if self._kernel is None else self._kernel.spell(node)
        if raw is None:
            spelled = bytearray()
            while node:
                spelled.append(int(self._node_byte[node]))
                node = self._parent(node)
            raw = bytes(spelled[::-1])
        return raw.decode("utf-8") if self._meta.values_are_str else raw

    def values(self) -> list[str | bytes]:
        """All distinct values, in sorted (UTF-8 byte) order, spelled from the trie at once."""
        counts = (self._node_word & LAZY_COUNT).astype(np.int64)
        parent = np.zeros(self._num_nodes, dtype=np.int64)
        parent[1:] = np.repeat(np.arange(self._num_nodes), counts)
        depth = np.repeat(np.arange(len(self._level_offsets) - 1), np.diff(self._level_offsets))
        nodes = self._value_nodes.astype(np.int64)
        lengths = depth[nodes]
        starts = np.zeros(len(nodes) + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        flat = np.zeros(int(starts[-1]), dtype=np.uint8)
        for step in range(int(lengths.max(initial=0))):
            active = np.flatnonzero(lengths > step)
            flat[starts[active] + lengths[active] - 1 - step] = self._node_byte[nodes[active]]
            nodes[active] = parent[nodes[active]]
        raw = flat.tobytes()
        spelled = [raw[a:b] for a, b in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True)]
        return [s.decode("utf-8") for s in spelled] if self._meta.values_are_str else list(spelled)

    def _value_index(self, state: int) -> int | None:
        node = self._node(state)
        if node == self._num_nodes:
            return None if state == DEAD else state - self._num_nodes
        return self._terminal_value(node) if self._node_word[node] & LAZY_TERMINAL else None

    # ------------------------------------------------------------------ description

    def stats(self) -> dict[str, Any]:
        """Structure of the automaton and its cache (``cache``: :meth:`cache_info`). Edge
        counts are not known without finding every node's edges: see the eager layout."""
        value_bytes = int((np.searchsorted(self._level_offsets, self._value_nodes, side="right") - 1).sum())
        return {
            "layout": "lazy",
            "values": self._num_values,
            "duplicates_collapsed": self._meta.input_values - self._num_values,
            "value_bytes": value_bytes,
            "trie_nodes": self._num_nodes - 1,
            "prefix_sharing_ratio": (self._num_nodes - 1) / value_bytes if value_bytes else 0.0,
            "forced_nodes": int(np.count_nonzero(self._node_word & (LAZY_TERMINAL | LAZY_COUNT) == 1)),
            "max_depth": len(self._level_offsets) - 2,
            "states": self.num_states,
            "trie_bytes": sum(a.nbytes for a in self._arrays()),
            "token_trie_bytes": self._token_trie.memory_bytes,
            "cache": self.cache_info(),
            "memory_bytes": self.memory_bytes,
            "compile_seconds": self._meta.compile_seconds,
            "eos": self._meta.eos,
            "eos_token_ids": list(self.eos_token_ids),
            "vocab_size": self._meta.vocab_size,
            "vocab_fingerprint": self._meta.vocab_fingerprint,
        }

    def __repr__(self) -> str:
        info = self.cache_info()
        return (
            f"LazyTrieAutomaton(values={self._num_values}, nodes={self._num_nodes}, eos={self._meta.eos}, "
            f"memory_bytes={self.memory_bytes}, cached_nodes={info['entries']}, cache_bytes={info['limit']})"
        )


register_kind("lazy", LazyTrieAutomaton)
