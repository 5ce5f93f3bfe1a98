"""Forced continuations (jump-forward): the bytes that every continuation from a state starts with.

The language of a state is the values (or, for a pattern, the strings) whose spelling begins
with what was decoded so far; its forced string is the longest common prefix of their rests.
In a byte trie or a minimal acyclic byte automaton a node forces its next byte when it has
exactly one edge and no value ends there (EOS, or the end of a field, could come instead), so
the forced string from a node is the run of such nodes below it. :class:`ForcedChains` keeps
each node's only edge (its byte and destination), or -1 where it branches, ends a value or has
no edge: five bytes a node, built on first use from the structure a kind already holds.

What is forced is the *byte* language's: a value that the vocabulary can spell only in part
still counts (the compilers refuse values no token sequence spells). Matchers hand the bytes
out as they are for ``bytes`` values and, for ``str`` values, as the longest prefix that is whole
UTF-8, or ``""`` where decoding stopped inside a character (xgrammar's
``find_jump_forward_string`` does the same).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..base import StateError, build_trie


@dataclass(frozen=True)
class ForcedChains:
    """Per node: the byte of its only edge and where it leads (``only_next`` -1: none)."""

    only_byte: npt.NDArray[np.uint8]
    only_next: npt.NDArray[np.int32]

    @classmethod
    def of_edges(
        cls,
        num_nodes: int,
        source: npt.NDArray[np.integer],
        byte: npt.NDArray[np.uint8],
        dest: npt.NDArray[np.integer],
        accepting: npt.NDArray[np.integer],
    ) -> ForcedChains:
        """The chains of a byte automaton given as edges ``source --byte--> dest``, its
        ``accepting`` nodes forcing nothing."""
        single = np.bincount(source, minlength=num_nodes) == 1
        single[accepting] = False
        chosen = single[source]
        only_next = np.full(num_nodes, -1, dtype=np.int32)
        only_byte = np.zeros(num_nodes, dtype=np.uint8)
        only_next[source[chosen]] = dest[chosen]
        only_byte[source[chosen]] = byte[chosen]
        return cls(only_byte, only_next)

    def forced(self, node: int) -> bytes:
        """The bytes forced from ``node`` (a node of the automaton)."""
        forced = bytearray()
        following = int(self.only_next[node])
        while following >= 0:
            forced.append(int(self.only_byte[node]))
            node, following = following, int(self.only_next[following])
        return bytes(forced)

    @property
    def forced_nodes(self) -> int:
        """How many nodes force their next byte."""
        return int(np.count_nonzero(self.only_next >= 0))


@dataclass(frozen=True)
class TrieChains:
    """A byte trie's parents and edge bytes (a node's prefix) and its forced chains."""

    parent: npt.NDArray[np.int32]
    byte: npt.NDArray[np.uint8]
    chains: ForcedChains

    @classmethod
    def of_values(cls, flat: npt.NDArray[np.integer], starts: npt.NDArray[np.integer], num_nodes: int) -> TrieChains:
        """The trie of the sorted distinct values ``flat`` / ``starts`` rebuilt (the compile's
        numbering: the same construction), checked to have the automaton's ``num_nodes``."""
        trie = build_trie(np.asarray(flat, dtype=np.uint8), np.asarray(starts, dtype=np.int64))
        if trie.num_nodes != num_nodes:
            raise StateError(f"the values spell {trie.num_nodes} trie nodes, the automaton has {num_nodes}")
        n = trie.num_nodes
        nodes = np.arange(1, n, dtype=np.int32)
        chains = ForcedChains.of_edges(n, trie.parent[1:], trie.byte[1:], nodes, trie.terminal)
        return cls(trie.parent, trie.byte, chains)

    def prefix(self, node: int) -> bytes:
        """The bytes that spell ``node``."""
        spelled = bytearray()
        while node > 0:
            spelled.append(int(self.byte[node]))
            node = int(self.parent[node])
        return bytes(reversed(spelled))


def forced_in_sorted(keys: list[bytes], prefix: bytes) -> bytes:
    """The forced string after ``prefix`` in a language given as its sorted byte strings:
    the common prefix of the first and the last of those that begin with ``prefix``, past it."""
    first = bisect_left(keys, prefix)
    end = len(keys) if not prefix.rstrip(b"\xff") else bisect_left(keys, _successor(prefix), first)
    if end - first < 1:
        return b""
    low, high = keys[first], keys[end - 1]
    shared = next((i for i in range(len(prefix), min(len(low), len(high))) if low[i] != high[i]), None)
    return low[len(prefix) : shared if shared is not None else min(len(low), len(high))]


def _successor(prefix: bytes) -> bytes:
    """The least byte string above every string that begins with ``prefix`` (not all 0xFF)."""
    kept = prefix.rstrip(b"\xff")
    return kept[:-1] + bytes([kept[-1] + 1])


def whole_characters(forced: bytes) -> str:
    """``forced`` as text: its longest prefix that is whole UTF-8; ``""`` when it begins inside
    a character (decoding stopped mid-character), as xgrammar answers there."""
    if forced[:1] and 0x80 <= forced[0] < 0xC0:
        return ""
    try:
        return forced.decode("utf-8")
    except UnicodeDecodeError as error:  # (a value's bytes are UTF-8: only the last character is cut)
        return forced[: error.start].decode("utf-8")
