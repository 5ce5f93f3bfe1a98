"""The per-vocabulary index: every text token, reversed, in one byte trie.

Built once per :class:`~triemask.Vocabulary` and shared by every compiled set.
A node of this trie stands for a byte string ``s`` that is a suffix of some
token (the trie spells ``s`` backwards). The compiler walks each trie path of a
value set from its end towards the root; extending ``s`` by the byte in front of
it is one transition here, and ``s`` is a whole token exactly when the node
carries a token id. This is the Aho-Corasick output function, computed by
prefix sharing from the other end: the compiler never scans the vocabulary.

A missing transition leads to a sentinel node (id ``num_nodes``) that carries no
token and has no children, so the compiler never filters for misses separately.

Transitions ``(node, byte) -> child`` live in two tables:

* a dense ``node * 256 + byte`` table for the shallow nodes (the first few
  levels, where the compiler does most of its lookups);
* an open-addressing hash table (linear probing, one ``uint64`` per slot
  holding key and child) for the deeper nodes.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from ..base import AutomatonFileError, build_trie, kernels, kinds_of, register_kind, storage
from .vocabulary import Vocabulary

_DENSE_TABLE_BYTES = 48 << 20  # budget for the dense transition rows
_HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing
_EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)


@dataclass(frozen=True)
class TokenTrie:
    """The vocabulary's text tokens in one forward byte trie (breadth-first numbered, children
    contiguous and in byte order), for the lazy layout: a token is allowed at a value-trie node
    exactly when its bytes spell a path down from that node.

    Attributes
    ----------
    children : int32 array, ``num_nodes + 1``
        Node ``u``'s children are ``children[u]:children[u + 1]``.
    node_byte : uint8 array
        The byte into each node (0 for the root).
    token_offsets, token_ids : int32 arrays
        The ids of the tokens spelling node ``u``'s string, ascending:
        ``token_ids[token_offsets[u]:token_offsets[u + 1]]`` (several ids may share bytes).
    """

    children: npt.NDArray[np.int32]
    node_byte: npt.NDArray[np.uint8]
    token_offsets: npt.NDArray[np.int32]
    token_ids: npt.NDArray[np.int32]
    # the C extension's TokenTrieTables by row width, made (and checked) once
    native: dict[int, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def memory_bytes(self) -> int:
        return sum(a.nbytes for a in (self.children, self.node_byte, self.token_offsets, self.token_ids))

    def native_tables(self, width: int) -> Any:
        """The arrays as the C extension's ``TokenTrieTables`` for rows of ``width`` words
        (checked once, then shared by every lazy kernel); only called when it is in use."""
        found = self.native.get(width)
        if found is None:  # (idempotent: either thread's tables may be kept)
            native = kernels.KERNELS
            assert native is not None
            arrays = (self.children, self.node_byte, self.token_offsets, self.token_ids)
            found = self.native.setdefault(width, native.TokenTrieTables(*arrays, width))
        return found


def token_trie_of(vocab: Vocabulary) -> TokenTrie:
    """The forward trie of ``vocab``'s text tokens (the lazy layout's; checked against a file's)."""
    lengths, _, data = vocab.byte_table()
    text_ids = np.flatnonzero(lengths > 0).astype(np.int32)
    starts = np.zeros(len(text_ids) + 1, dtype=np.int64)
    np.cumsum(lengths[text_ids], out=starts[1:])
    if len(text_ids) == 0:  # no text at all: the root alone
        starts = np.zeros(2, dtype=np.int64)
    trie = build_trie(np.frombuffer(data, dtype=np.uint8), starts, return_inverse=True)
    n = trie.num_nodes
    children = np.ones(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(trie.parent[1:], minlength=n), out=children[1:])
    children[1:] += 1
    token_offsets = np.zeros(n + 1, dtype=np.int32)
    token_ids = np.zeros(0, dtype=np.int32)
    if len(text_ids):
        nodes = trie.terminal[trie.inverse]
        order = np.lexsort((text_ids, nodes))
        token_ids = text_ids[order]
        np.cumsum(np.bincount(nodes, minlength=n), out=token_offsets[1:])
    tokens = TokenTrie(children, trie.byte.copy(), token_offsets, token_ids)
    for array in (tokens.children, tokens.node_byte, tokens.token_offsets, tokens.token_ids):
        array.flags.writeable = False
    return tokens


class TokenIndex:
    """The reversed-token trie of a vocabulary, with its transition tables.

    Parameters
    ----------
    vocab : Vocabulary
        The vocabulary to index.
    """

    __slots__ = (
        "build_seconds",
        "byte_in_token",
        "byte_is_token",
        "child_offsets",
        "dense",
        "dense_levels",
        "dup_offsets",
        "dup_tokens",
        "first_token",
        "has_children",
        "hash_shift",
        "hash_table",
        "level_offsets",
        "native",
        "node_byte",
        "num_nodes",
        "token_trie_lock",
        "token_trie_value",
        "vocab",
    )

    # What a cached file holds: the trie and its tokens, checked against the vocabulary on load.
    # The transition tables (dense rows, hash table, byte flags, levels) are derived from them
    # on load, never read from a file (a consistent lie there would mislead every compile).
    _SCALARS = ("num_nodes",)
    _ARRAYS = ("first_token", "child_offsets", "node_byte")

    def __init__(self, vocab: Vocabulary) -> None:
        started = time.perf_counter()
        self.vocab = vocab
        lengths, _, data = vocab.byte_table()
        text_ids = np.flatnonzero(lengths > 0)
        token_lengths = lengths[text_ids].astype(np.int64)
        raw = np.frombuffer(data, dtype=np.uint8)
        # Reversing the concatenation reverses every token and their order.
        flat = raw[::-1].copy()
        starts = np.zeros(len(text_ids) + 1, dtype=np.int64)
        np.cumsum(token_lengths[::-1], out=starts[1:])
        reversed_ids = text_ids[::-1].astype(np.int32)
        if len(text_ids) == 0:  # no text at all: a trie of the empty string, the root alone
            starts = np.zeros(2, dtype=np.int64)
        trie = build_trie(flat, starts, return_inverse=True)
        n = trie.num_nodes
        self.num_nodes = n

        # Token ids ending at each node: the smallest in first_token, any others
        # (ids with identical bytes, e.g. "A" and byte-fallback "<0x41>") in a CSR.
        # Index n is the sentinel.
        first_token = np.full(n + 1, np.iinfo(np.int32).max, dtype=np.int32)
        self.dup_tokens = self.dup_offsets = None
        if len(text_ids):
            node_of_token = trie.terminal[trie.inverse]
            np.minimum.at(first_token, node_of_token, reversed_ids)
            dup_mask = first_token[node_of_token] != reversed_ids
            if dup_mask.any():
                dup_nodes = node_of_token[dup_mask]
                dup_ids = reversed_ids[dup_mask]
                order = np.lexsort((dup_ids, dup_nodes))
                self.dup_tokens = dup_ids[order]
                self.dup_offsets = np.zeros(n + 2, dtype=np.int64)
                np.cumsum(np.bincount(dup_nodes, minlength=n + 1), out=self.dup_offsets[1:])
        first_token[first_token == np.iinfo(np.int32).max] = -1
        self.first_token = first_token

        # Children are contiguous ids in byte order (breadth-first numbering): node u's are
        # child_offsets[u]:child_offsets[u + 1], with node_byte the byte into each node.
        self.child_offsets = np.ones(n + 2, dtype=np.int32)
        np.cumsum(np.bincount(trie.parent[1:], minlength=n + 1), out=self.child_offsets[1:])
        self.child_offsets[1:] += 1
        self.node_byte = np.append(trie.byte, np.uint8(0))
        self._derive(started)

    def _derive(self, started: float) -> None:
        """The transition tables, from the trie (``child_offsets``, ``node_byte``) and the tokens."""
        n = self.num_nodes
        counts = np.diff(self.child_offsets)
        parents = np.repeat(np.arange(n + 1, dtype=np.int64), counts)  # of nodes 1 .. n - 1
        self.has_children = counts > 0
        levels = [0, 1]  # breadth-first: a level's children are the next level
        while levels[-1] > levels[-2]:
            levels.append(int(self.child_offsets[levels[-1]]))
        self.level_offsets = np.array(levels[:-1], dtype=np.int64)
        # Dense rows for whole levels while they fit the budget.
        dense_levels = 1
        while (
            dense_levels < len(self.level_offsets) - 1
            and self.level_offsets[dense_levels + 1] * 256 * 4 <= _DENSE_TABLE_BYTES
        ):
            dense_levels += 1
        dense_nodes = int(self.level_offsets[dense_levels])
        self.dense_levels = dense_levels  # nodes of depth < dense_levels have dense rows
        children = np.arange(1, n, dtype=np.int32)
        keys = parents * 256 + self.node_byte[1:n]
        in_dense = parents < dense_nodes
        self.dense = np.full(dense_nodes * 256, n, dtype=np.int32)
        self.dense[keys[in_dense]] = children[in_dense]
        self.hash_table, self.hash_shift = _build_hash(
            keys[~in_dense].astype(np.uint64), children[~in_dense].astype(np.uint64)
        )
        self.byte_is_token = self.first_token[self.dense[:256]] >= 0
        self.byte_in_token = np.bincount(np.frombuffer(self.vocab.byte_table()[2], dtype=np.uint8), minlength=256) > 0
        for array in self._arrays():
            array.flags.writeable = False
        self.native: Any = None  # the C compiler's view of the tables, made on first use
        self.token_trie_value: TokenTrie | None = None  # the forward trie, made on first use
        self.token_trie_lock = threading.Lock()
        self.build_seconds = time.perf_counter() - started

    @classmethod
    def cached(cls, vocab: Vocabulary, directory: Path | None) -> tuple[TokenIndex, str]:
        """The index of ``vocab``: read from ``directory`` (a file named by the vocabulary's
        fingerprint, in triemask's file format) when there, else built and written there.
        Returns the index and what happened (``"loaded"``, ``"built"``, ``"built, written"``,
        or why the file was not used). A file that fails any check is rebuilt, never trusted."""
        if directory is None:
            return cls(vocab), "built"
        trusted, why = storage.trusted_directory(directory)
        if trusted is None:
            return cls(vocab), f"built ({why})"
        path = directory / f"token-index-{vocab.fingerprint}.tmi"
        note = "built"
        if path.is_file():
            started = time.perf_counter()
            try:
                index = storage.load(  # checksums on worker threads while the index is checked
                    path,
                    kinds=kinds_of(TokenIndex),
                    vocab_fingerprint=vocab.fingerprint,
                    build=lambda stored: cls._from_stored(vocab, stored, started),
                )
            except (AutomatonFileError, KeyError, TypeError, ValueError) as error:
                note = f"built (the cached file was not usable: {error})"
            else:
                return index, "loaded"
        index = cls(vocab)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            arrays = {name: getattr(index, name) for name in cls._ARRAYS}
            if index.dup_tokens is not None and index.dup_offsets is not None:
                arrays.update(dup_tokens=index.dup_tokens, dup_offsets=index.dup_offsets)
            meta = {name: int(getattr(index, name)) for name in cls._SCALARS}
            storage.write(path, "token_index", meta, arrays, vocab_fingerprint=vocab.fingerprint, set_fingerprint="")
        except OSError as error:  # a read-only or full disk: the index works, unsaved
            return index, f"{note}, not written ({error.strerror or error})"
        return index, f"{note}, written"

    @classmethod
    def _from_stored(cls, vocab: Vocabulary, stored: storage.Stored, started: float) -> TokenIndex:
        index = cls.__new__(cls)
        index.vocab = vocab
        for name in cls._SCALARS:
            value = stored.meta[name]
            if type(value) is not int or value < 0:
                raise TypeError(f"{name} must be a non-negative integer")
            setattr(index, name, value)
        for name in cls._ARRAYS:
            setattr(index, name, stored.arrays[name])
        index.dup_tokens = stored.arrays.get("dup_tokens")
        index.dup_offsets = stored.arrays.get("dup_offsets")
        index._check()
        index._derive(started)
        return index

    _DTYPES: ClassVar[dict[str, Any]] = {
        "first_token": np.int32,
        "child_offsets": np.int32,
        "node_byte": np.uint8,
        "dup_tokens": np.int32,
        "dup_offsets": np.int64,
    }

    def _check(self) -> None:
        """What a cached file holds, before anything is derived from it: dtypes, sizes, and
        that its trie spells exactly the vocabulary's tokens (:meth:`_check_tokens`)."""
        for name, dtype in self._DTYPES.items():
            array = getattr(self, name)
            if array is not None and (array.dtype != dtype or array.ndim != 1):
                raise ValueError(
                    f"{name} is {array.dtype} of {array.ndim} dimensions, not a 1-D {np.dtype(dtype)} array"
                )
        n = self.num_nodes
        sizes = {"first_token": n + 1, "child_offsets": n + 2, "node_byte": n + 1}
        for name, size in sizes.items():
            if len(getattr(self, name)) != size:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries, not {size}")
        if n < 1 or int(self.first_token[n]) != -1:
            raise ValueError("the trie has no root, or its sentinel node holds a token")
        if (
            (np.diff(self.child_offsets) < 0).any()
            or int(self.child_offsets[0]) != 1
            or int(self.child_offsets[-1]) != n
        ):
            raise ValueError("child offsets are not ascending over the trie's nodes")
        self._check_tokens()

    def _check_tokens(self) -> None:
        """That the trie holds every text token of the vocabulary once, each at the node its
        reversed bytes lead to (an index of another vocabulary under this one's name gives
        wrong masks otherwise): a walk up from every token's node, all tokens a step at a time."""
        n = self.num_nodes
        lengths, starts, data = self.vocab.byte_table()
        raw = np.frombuffer(data, dtype=np.uint8)
        nodes = np.flatnonzero(self.first_token[:n] >= 0)
        tokens = self.first_token[nodes].astype(np.int64)
        if self.dup_tokens is not None and self.dup_offsets is not None:
            if len(self.dup_offsets) != n + 2 or (np.diff(self.dup_offsets) < 0).any():
                raise ValueError("duplicate-token offsets out of order")
            if int(self.dup_offsets[0]) != 0 or int(self.dup_offsets[-1]) != len(self.dup_tokens):
                raise ValueError("duplicate-token offsets past their tokens")
            counts = np.diff(self.dup_offsets[: n + 1])
            nodes = np.concatenate([nodes, np.repeat(np.arange(n), counts)])
            tokens = np.concatenate([tokens, self.dup_tokens[: int(self.dup_offsets[n])].astype(np.int64)])
        text_ids = np.flatnonzero(lengths > 0)
        if len(tokens) != len(text_ids) or not np.array_equal(np.sort(tokens), text_ids):
            raise ValueError("the trie does not hold the vocabulary's text tokens, each once")
        parent = np.repeat(np.arange(n + 1), np.diff(self.child_offsets))  # of nodes 1 .. n - 1
        parent = np.concatenate([[0], parent])
        at, position, left = nodes.astype(np.int64), starts[tokens].astype(np.int64), lengths[tokens].astype(np.int64)
        while len(at):
            if (at == 0).any() or (self.node_byte[at] != raw[position]).any():
                raise ValueError("a token's bytes do not lead to the node that holds it")
            at, position, left = parent[at], position + 1, left - 1
            more = left > 0
            if (at[~more] != 0).any():
                raise ValueError("a token's node is deeper than its bytes")
            at, position, left = at[more], position[more], left[more]

    def token_trie(self) -> TokenTrie:
        """The forward trie of the text tokens (built on first use, for the lazy layout)."""
        with self.token_trie_lock:
            if self.token_trie_value is None:
                self.token_trie_value = token_trie_of(self.vocab)
            return self.token_trie_value

    def native_tables(self) -> Any:
        """The tables as the C extension's ``Tables`` (checked once, then shared by every
        compile); only called when the extension is in use."""
        if self.native is None:
            assert kernels.KERNELS is not None
            self.native = kernels.KERNELS.Tables(
                self.dense,
                len(self.dense) // 256,
                self.hash_table,
                self.hash_shift,
                self.first_token,
                self.has_children,
                self.dup_offsets,
                self.dup_tokens,
                self.child_offsets,
                self.node_byte,
            )
        return self.native

    def _arrays(self) -> list[npt.NDArray[Any]]:
        arrays = [
            self.first_token,
            self.has_children,
            self.dense,
            self.hash_table,
            self.level_offsets,
            self.byte_is_token,
            self.byte_in_token,
            self.child_offsets,
            self.node_byte,
        ]
        if self.dup_tokens is not None and self.dup_offsets is not None:
            arrays += [self.dup_tokens, self.dup_offsets]
        return arrays

    @property
    def memory_bytes(self) -> int:
        """Bytes held by the index's arrays."""
        return sum(a.nbytes for a in self._arrays())

    def step(self, nodes: npt.NDArray[np.int32], bytes_: npt.NDArray[np.uint8], level: int) -> npt.NDArray[np.int32]:
        """Children ``nodes[i] --bytes_[i]-->``; the sentinel ``num_nodes`` where there
        is none. All ``nodes`` are at depth ``level``."""
        if level < self.dense_levels:
            children: npt.NDArray[np.int32] = self.dense[(nodes.astype(np.int64) << 8) | bytes_]
            return children
        keys = (nodes.astype(np.uint64) << np.uint64(8)) | bytes_
        return _hash_lookup(self.hash_table, self.hash_shift, keys, self.num_nodes)

    def stats(self) -> dict[str, Any]:
        """Sizes of the index."""
        return {
            "reversed_token_trie_nodes": self.num_nodes,
            "max_token_bytes": len(self.level_offsets) - 2,
            "dense_levels": self.dense_levels,
            "hash_entries": int(np.count_nonzero(self.hash_table != _EMPTY)),
            "hash_slots": len(self.hash_table),
            "duplicate_byte_tokens": 0 if self.dup_tokens is None else len(self.dup_tokens),
            "memory_bytes": self.memory_bytes,
            "build_seconds": self.build_seconds,
        }


def _slots(keys: npt.NDArray[np.uint64], shift: int) -> npt.NDArray[np.int64]:
    slots: npt.NDArray[np.int64] = ((keys * _HASH_MULTIPLIER) >> np.uint64(shift)).astype(np.int64)
    return slots


def _build_hash(keys: npt.NDArray[np.uint64], values: npt.NDArray[np.uint64]) -> tuple[npt.NDArray[np.uint64], int]:
    """Open-addressing table of ``key << 32 | value`` at load factor <= 1/4."""
    bits = max(4, int(np.ceil(np.log2(max(len(keys), 1) * 4))))
    size = 1 << bits
    shift = 64 - bits
    native = kernels.KERNELS
    if native is not None:  # the same table, filled by sequential insertion in C
        return np.frombuffer(native.build_hash(keys, values, bits), dtype=np.uint64), shift
    table = np.full(size, _EMPTY, dtype=np.uint64)
    entries = (keys << np.uint64(32)) | values
    slots = _slots(keys, shift)
    pending = np.arange(len(keys))
    claim = np.full(size, -1, dtype=np.int64)
    while pending.size:
        s = slots[pending]
        free = table[s] == _EMPTY
        candidates = pending[free]
        candidate_slots = s[free]
        claim[candidate_slots] = candidates  # one candidate per free slot wins
        won = claim[candidate_slots] == candidates
        table[candidate_slots[won]] = entries[candidates[won]]
        placed = np.zeros(len(keys), dtype=bool)
        placed[candidates[won]] = True
        pending = pending[~placed[pending]]
        slots[pending] = (slots[pending] + 1) & (size - 1)
    return table, shift


def _hash_lookup(
    table: npt.NDArray[np.uint64], shift: int, keys: npt.NDArray[np.uint64], missing: int
) -> npt.NDArray[np.int32]:
    mask = len(table) - 1
    slots = _slots(keys, shift)
    entries = table[slots]
    hit = (entries >> np.uint64(32)) == keys
    result: npt.NDArray[np.int32] = (entries & np.uint64(0xFFFFFFFF)).astype(np.int32)
    result[~hit] = missing
    # At load factor 1/4 few keys need a second probe.
    probe = np.flatnonzero(~hit & (entries != _EMPTY))
    while probe.size:
        slots[probe] = (slots[probe] + 1) & mask
        entries = table[slots[probe]]
        hit = (entries >> np.uint64(32)) == keys[probe]
        result[probe[hit]] = (entries[hit] & np.uint64(0xFFFFFFFF)).astype(np.int32)
        probe = probe[~hit & (entries != _EMPTY)]
    return result


register_kind("token_index", TokenIndex)
