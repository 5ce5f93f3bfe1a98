"""Byte DAGs: deterministic acyclic byte automata, nodes numbered by level, and the DAG of a trie."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from . import kernels
from .trie import ByteTrie


@dataclass(frozen=True)
class ByteDag:
    """A deterministic acyclic byte automaton, nodes numbered by level.

    Node 0 is the start. ``level_offsets[d]:level_offsets[d + 1]`` are the nodes
    whose longest path from the start has ``d`` bytes, so every edge leads from a
    lower level to a higher one. Edges are sorted by destination (the compiler
    walks them backwards): the edges into ``m`` are ``in_offsets[m]:in_offsets[m + 1]``.
    """

    in_offsets: npt.NDArray[np.int64]
    source: npt.NDArray[np.int32]
    byte: npt.NDArray[np.uint8]
    dest: npt.NDArray[np.int32]
    accepting: npt.NDArray[np.int32]  # ascending node ids
    level_offsets: npt.NDArray[np.int64]

    @property
    def num_nodes(self) -> int:
        return len(self.in_offsets) - 1

    @property
    def num_edges(self) -> int:
        return len(self.source)

    def language_size(self) -> int:
        """How many strings the automaton accepts (exact, as a Python int)."""
        return self.path_counts()[0]

    def path_counts(self) -> list[int]:
        """For each node, how many accepted strings start there (Python ints: a
        UUID pattern has 16**32)."""
        n = self.num_nodes
        counts = [0] * n
        for node in self.accepting.tolist():
            counts[node] = 1
        out = self.out_edges()
        for node in range(n - 1, -1, -1):  # deeper levels first
            counts[node] += sum(counts[d] for _, d in out[node])
        return counts

    def out_edges(self) -> list[list[tuple[int, int]]]:
        """``(byte, destination)`` of each node's edges, bytes ascending."""
        out: list[list[tuple[int, int]]] = [[] for _ in range(self.num_nodes)]
        for s, b, d in sorted(zip(self.source.tolist(), self.byte.tolist(), self.dest.tolist(), strict=True)):
            out[s].append((b, d))
        return out


def dag_arrays(n: int, sources: Any, bytes_: Any, dests: Any, accept: Any, levels: npt.NDArray[np.int64]) -> ByteDag:
    source = np.asarray(sources, dtype=np.int32)
    byte = np.asarray(bytes_, dtype=np.uint8)
    dest = np.asarray(dests, dtype=np.int32)
    order = np.lexsort((byte, source, dest))
    source, byte, dest = source[order], byte[order], dest[order]
    accepting = np.asarray(accept, dtype=np.int32)
    accepting.flags.writeable = False
    in_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dest, minlength=n), out=in_offsets[1:])
    level_offsets = np.zeros(len(levels) + 1, dtype=np.int64)
    np.cumsum(levels, out=level_offsets[1:])
    for array in (in_offsets, source, byte, dest, level_offsets):
        array.flags.writeable = False
    return ByteDag(
        in_offsets=in_offsets,
        source=source,
        byte=byte,
        dest=dest,
        accepting=accepting,
        level_offsets=level_offsets,
    )


def mix64(values: npt.NDArray[np.uint64], seed: int = 0) -> npt.NDArray[np.uint64]:
    """splitmix64's finaliser of ``values ^ seed``: hashes whose sums identify sets (of a
    node's children, of a byte's edges), checked exactly where a collision would matter."""
    with np.errstate(over="ignore"):
        z = values ^ np.uint64(seed)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        result: npt.NDArray[np.uint64] = z ^ (z >> np.uint64(31))
    return result


def dag_from_buffers(arrays: tuple[bytearray, ...]) -> ByteDag:
    """The ByteDag of the C kernel's six arrays (``pattern_dag``, ``dag_of_trie``), as laid out
    by :func:`dag_arrays` (edges by destination, source and byte), made read-only."""
    dtypes = (np.int64, np.int32, np.uint8, np.int32, np.int32, np.int64)
    in_offsets, source, byte, dest, accepting, level_offsets = (
        np.frombuffer(array, dtype=dtype) for array, dtype in zip(arrays, dtypes, strict=True)
    )
    for array in (in_offsets, source, byte, dest, accepting, level_offsets):
        array.flags.writeable = False
    return ByteDag(in_offsets, source, byte, dest, accepting, level_offsets)


def dag_of_trie(trie: ByteTrie) -> ByteDag:
    """The minimal acyclic automaton of a trie's strings: nodes with the same right
    language (same continuations) merged (in C where the kernel is built; the array
    operations below are the reference).

    Nodes are processed by height (the longest path below them); a node's signature is
    whether it ends a string plus the set of ``(byte, merged child)`` pairs, hashed. Nodes
    are numbered as :func:`canonical_numbering` says.
    """
    native = kernels.KERNELS
    if native is not None:
        return dag_from_buffers(native.dag_of_trie(trie.parent, trie.byte, trie.terminal))
    n = trie.num_nodes
    parent, byte, levels = trie.parent, trie.byte, trie.level_offsets
    depth = np.repeat(np.arange(len(levels) - 1), np.diff(levels))
    terminal = np.zeros(n, dtype=bool)
    terminal[trie.terminal] = True
    counts = np.bincount(parent[1:], minlength=n)
    first_child = np.searchsorted(parent[1:], np.arange(n)) + 1
    height = np.zeros(n, dtype=np.int64)
    for d in range(len(levels) - 2, 0, -1):  # children sit one level down and are grouped by parent
        lo, hi = int(levels[d]), int(levels[d + 1])
        owners = parent[lo:hi]
        starts = np.flatnonzero(np.concatenate(([True], owners[1:] != owners[:-1])))
        height[owners[starts]] = np.maximum(height[owners[starts]], np.maximum.reduceat(height[lo:hi] + 1, starts))
    canon = np.zeros(n, dtype=np.int64)
    by_height = np.argsort(height, kind="stable")
    bounds = np.searchsorted(height[by_height], np.arange(int(height.max()) + 2))
    classes = 0
    for h in range(len(bounds) - 1):
        nodes = by_height[bounds[h] : bounds[h + 1]]
        if not nodes.size:
            continue
        k = counts[nodes]
        total = int(k.sum())
        children = np.arange(total) + np.repeat(first_child[nodes] - (np.cumsum(k) - k), k)
        pairs = (byte[children].astype(np.uint64) << np.uint64(40)) | canon[children].astype(np.uint64)
        group = np.flatnonzero(k)
        sums = np.zeros((len(nodes), 2), dtype=np.uint64)
        if total:
            starts = np.concatenate(([0], np.cumsum(k[group])[:-1]))
            with np.errstate(over="ignore"):
                sums[group, 0] = np.add.reduceat(mix64(pairs, 0x9E3779B97F4A7C15), starts)
                sums[group, 1] = np.add.reduceat(mix64(pairs, 0xD1B54A32D192ED03), starts)
        extra = (k.astype(np.uint64) << np.uint64(1)) | terminal[nodes]
        with np.errstate(over="ignore"):
            key = sums[:, 0] + mix64(extra, 0x2545F4914F6CDD1D)
            check = sums[:, 1] ^ extra
        first, inverse = np.unique(key, return_index=True, return_inverse=True)[1:]
        if not np.array_equal(check, check[first][inverse]):  # a 64-bit collision: compare in full
            rows = np.column_stack((sums.view(np.int64), k, terminal[nodes]))
            inverse = np.unique(rows, axis=0, return_inverse=True)[1]
        canon[nodes] = classes + inverse.reshape(-1)
        classes += int(inverse.max()) + 1
    # one representative per class gives its edges; a class's level is its deepest member's depth
    representative = np.unique(canon, return_index=True)[1]
    level = np.zeros(classes, dtype=np.int64)
    np.maximum.at(level, canon, depth)
    k = counts[representative]
    children = np.arange(int(k.sum())) + np.repeat(first_child[representative] - (np.cumsum(k) - k), k)
    sources = np.repeat(np.arange(classes), k)
    dests = canon[children]
    number = canonical_numbering(level, sources, byte[children], dests)
    accept = np.sort(number[np.flatnonzero(terminal[representative])])
    return dag_arrays(classes, number[sources], byte[children], number[dests], accept, np.bincount(level))


def canonical_numbering(
    level: npt.NDArray[np.int64], sources: npt.NDArray[Any], byte: npt.NDArray[np.uint8], dests: npt.NDArray[Any]
) -> npt.NDArray[np.int64]:
    """The number of each node of an acyclic automaton (the C kernel's numbering): level by
    level (``level``: the longest distance from the start, whose level alone is 0), and within
    a level by the smallest ``(number of the source, byte)`` of an edge in, distinct by
    determinism. Edges into a level come from lower levels, numbered by then."""
    count = len(level)
    number = np.full(count, -1, dtype=np.int64)
    key = np.full(count, np.iinfo(np.int64).max, dtype=np.int64)
    by_level = np.argsort(level, kind="stable")
    bounds = np.searchsorted(level[by_level], np.arange(int(level.max(initial=0)) + 2))
    edge_order = np.argsort(level[sources], kind="stable")
    edge_bounds = np.searchsorted(level[sources][edge_order], np.arange(int(level.max(initial=0)) + 2))
    for at in range(len(bounds) - 1):
        members = by_level[bounds[at] : bounds[at + 1]]
        members = members[np.argsort(key[members], kind="stable")]
        number[members] = np.arange(bounds[at], bounds[at + 1])
        edges = edge_order[edge_bounds[at] : edge_bounds[at + 1]]  # the edges out of this level
        np.minimum.at(key, dests[edges], number[sources[edges]] * 256 + byte[edges])
    return number
