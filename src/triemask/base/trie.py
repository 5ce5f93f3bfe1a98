"""A byte trie of a set of byte strings, built with array operations only.

Both sides of the matching use it: the trie of the values to constrain to, and
the trie of the vocabulary's reversed tokens (see ``_token_index``).

Nodes are numbered breadth-first, and inside one depth in lexicographic order of
the strings they spell. Two facts follow that the compiler relies on:

* ``parent`` is non-decreasing in node id, so the ancestor ``l`` levels up of a
  run of ascending node ids is itself ascending;
* the children of a node are contiguous ids, in byte order.

The construction sorts the strings once, takes the longest common prefix (LCP) of
each neighbouring pair, and creates, for string ``i``, the nodes at depths
``lcp[i] + 1 .. len[i]`` (the preorder of the trie). A stable radix sort by depth
turns the preorder into the breadth-first order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from . import kernels

# Above this many cells the padded (strings x longest) matrix is not worth building.
_MAX_MATRIX_CELLS = 1 << 27


@dataclass(frozen=True)
class ByteTrie:
    """A breadth-first numbered byte trie (node 0 is the root, the empty string).

    Attributes
    ----------
    parent : int32 array, one per node
        Parent node (the root is its own parent).
    byte : uint8 array, one per node
        The byte on the edge into the node (0 for the root).
    level_offsets : int64 array
        Nodes of depth ``d`` are ``level_offsets[d]:level_offsets[d + 1]``.
    terminal : int32 array, one per distinct string
        The node each distinct string ends at, strings in sorted order.
    flat, starts : uint8 array, int64 array
        The distinct strings in sorted order, concatenated; string ``i`` is
        ``flat[starts[i]:starts[i + 1]]``.
    inverse : int64 array or None
        For each input string, the index of its distinct string (when requested).
    """

    parent: npt.NDArray[np.int32]
    byte: npt.NDArray[np.uint8]
    level_offsets: npt.NDArray[np.int64]
    terminal: npt.NDArray[np.int32]
    flat: npt.NDArray[np.uint8]
    starts: npt.NDArray[np.int64]
    inverse: npt.NDArray[np.int64] | None

    @property
    def num_nodes(self) -> int:
        return len(self.parent)

    @property
    def num_strings(self) -> int:
        return len(self.terminal)

    def string(self, i: int) -> bytes:
        """The ``i``-th distinct string (sorted order)."""
        return self.flat[self.starts[i] : self.starts[i + 1]].tobytes()


def _sorted_unique_matrix(
    flat_in: npt.NDArray[np.uint8],
    starts_in: npt.NDArray[np.int64],
    width: int,
    return_inverse: bool,
    strings: list[bytes] | None,
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64] | None]:
    """Sort and deduplicate as rows of a fixed-width numpy byte-string array.

    numpy's fixed-width strings treat NUL as padding, so when the data holds NUL
    bytes each byte ``b`` is first spelled as the two non-zero bytes
    ``(b >> 1) + 1, (b & 1) + 1``, which sort in the same order.
    """
    k = len(starts_in) - 1
    lengths_in = np.diff(starts_in)
    spread = bool((flat_in == 0).any())
    if strings is not None and not spread:  # numpy pads a list of bytes in C
        matrix = np.array(strings, dtype=f"S{width}").view(np.uint8).reshape(k, width)
    else:
        matrix = np.zeros((k, width), dtype=np.uint8)
        shift = np.arange(k, dtype=np.int64) * width - starts_in[:-1]
        matrix.reshape(-1)[np.arange(len(flat_in)) + np.repeat(shift, lengths_in)] = flat_in
    if spread:
        valid = np.arange(width) < lengths_in[:, None]
        wide = np.zeros((k, 2 * width), dtype=np.uint8)
        wide[:, 0::2] = np.where(valid, (matrix >> 1) + 1, 0)
        wide[:, 1::2] = np.where(valid, (matrix & 1) + 1, 0)
        matrix = wide
    padded = matrix.view(f"S{matrix.shape[1]}").ravel()
    order = np.argsort(padded, kind="stable") if return_inverse else None
    padded = padded[order] if order is not None else np.sort(padded)
    matrix = padded.view(np.uint8).reshape(k, -1)
    differs_at = matrix[1:] != matrix[:-1]
    differs = differs_at.any(axis=1)
    keep = np.concatenate(([True], differs))
    lcp = np.concatenate(([0], np.argmax(differs_at, axis=1)[differs])).astype(np.int64)
    unique = matrix[keep]
    lengths = np.count_nonzero(unique, axis=1).astype(np.int64)
    if spread:
        unique = ((unique[:, 0::2] - 1) << 1) | (unique[:, 1::2] - 1)
        lengths //= 2
        lcp //= 2
    flat = unique[np.arange(width) < lengths[:, None]]
    inverse = None
    if order is not None:
        inverse = np.empty(k, dtype=np.int64)
        inverse[order] = np.cumsum(keep) - 1
    return flat, lengths, lcp, inverse


def _sorted_unique_python(
    flat_in: npt.NDArray[np.uint8], starts_in: npt.NDArray[np.int64], return_inverse: bool
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64] | None]:
    """Sort and deduplicate with Python's bytes ordering (for ragged lengths)."""
    data = flat_in.tobytes()
    values = [data[s:e] for s, e in zip(starts_in[:-1].tolist(), starts_in[1:].tolist(), strict=True)]
    unique = sorted(set(values))
    flat = np.frombuffer(b"".join(unique), dtype=np.uint8)
    lengths = np.fromiter(map(len, unique), dtype=np.int64, count=len(unique))
    inverse = None
    if return_inverse:
        index = dict(zip(unique, range(len(unique)), strict=True))
        inverse = np.fromiter(map(index.__getitem__, values), dtype=np.int64, count=len(values))
    return flat, lengths, _neighbour_lcp(flat, lengths), inverse


def _neighbour_lcp(flat: npt.NDArray[np.uint8], lengths: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Longest common prefix of each string with the one before it (0 for the first)."""
    k = len(lengths)
    lcp = np.zeros(k, dtype=np.int64)
    if k < 2:
        return lcp
    starts = np.cumsum(lengths) - lengths
    shared = np.minimum(lengths[1:], lengths[:-1])
    pair = np.repeat(np.arange(k - 1), shared)
    offset = np.arange(len(pair)) - np.repeat(np.cumsum(shared) - shared, shared)
    mismatch = np.flatnonzero(flat[starts[pair + 1] + offset] != flat[starts[pair] + offset])
    lcp[1:] = shared
    if mismatch.size:
        pairs = pair[mismatch]
        first = np.concatenate(([True], pairs[1:] != pairs[:-1]))
        lcp[pairs[first] + 1] = offset[mismatch][first]
    return lcp


def build_trie(
    flat: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.int64],
    *,
    return_inverse: bool = False,
    strings: list[bytes] | None = None,
) -> ByteTrie:
    """Build the breadth-first byte trie of a set of strings (duplicates collapse).

    Parameters
    ----------
    flat, starts : uint8 array, int64 array
        The strings concatenated; string ``i`` is ``flat[starts[i]:starts[i + 1]]``.
        At least one string; the empty string is allowed (it ends at the root).
    return_inverse : bool
        Also return, for each input, the index of its distinct string.
    strings : list of bytes, optional
        The same strings as Python bytes, when the caller has them (numpy pads
        those faster than it scatters ``flat``).
    """
    native = kernels.KERNELS
    if native is not None:  # the same construction in C (one sort of the strings, one pass)
        parent, byte, levels, terminal, distinct, offsets, inverse = native.build_trie(
            np.ascontiguousarray(flat, dtype=np.uint8), np.ascontiguousarray(starts, dtype=np.int64), return_inverse
        )
        return ByteTrie(
            parent=np.frombuffer(parent, dtype=np.int32),
            byte=np.frombuffer(byte, dtype=np.uint8),
            level_offsets=np.frombuffer(levels, dtype=np.int64),
            terminal=np.frombuffer(terminal, dtype=np.int32),
            flat=np.frombuffer(distinct, dtype=np.uint8),
            starts=np.frombuffer(offsets, dtype=np.int64),
            inverse=None if inverse is None else np.frombuffer(inverse, dtype=np.int64),
        )
    k_in = len(starts) - 1
    width = int(np.diff(starts).max())
    cells = k_in * width
    # The padded matrix wastes little when lengths are alike (value sets); ragged
    # sets (vocabularies: a few 128-byte tokens among 6-byte ones) sort in Python.
    if width > 0 and cells <= _MAX_MATRIX_CELLS and cells <= 4 * len(flat) + k_in:
        flat, lengths, lcp, inverse = _sorted_unique_matrix(flat, starts, width, return_inverse, strings)
    else:
        flat, lengths, lcp, inverse = _sorted_unique_python(flat, starts, return_inverse)
    k = len(lengths)
    starts = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])

    # Preorder: string i creates the nodes at depths lcp[i] + 1 .. lengths[i].
    created = lengths - lcp
    n = 1 + int(created.sum())
    creator = np.repeat(np.arange(k, dtype=np.int64), created)
    first_pre = np.cumsum(created) - created + 1  # preorder id of string i's first new node
    depth = np.arange(1, n, dtype=np.int64) - first_pre[creator] + lcp[creator] + 1
    byte_pre = flat[starts[creator] + depth - 1]

    # Breadth-first order = stable sort of the preorder by depth (radix sort for
    # 16-bit keys); within a depth the preorder is lexicographic.
    max_depth = int(depth.max()) if n > 1 else 0
    depth_key = depth.astype(np.uint16) if max_depth < 1 << 16 else depth
    order = np.argsort(depth_key, kind="stable")  # bfs position - 1 -> preorder id - 1
    bfs_of_pre = np.empty(n, dtype=np.int64)
    bfs_of_pre[0] = 0
    bfs_of_pre[order + 1] = np.arange(1, n)

    level_offsets = np.zeros(max_depth + 2, dtype=np.int64)
    level_offsets[1:] = 1 + np.cumsum(np.bincount(depth, minlength=max_depth + 1))[: max_depth + 1]

    # Parent of a preorder node p: p - 1, unless p is the first node its string
    # creates; then it is the node at depth lcp on the path, created by the last
    # string before this one that has a node at that depth.
    parent_pre = np.arange(n, dtype=np.int64) - 1
    parent_pre[0] = 0
    creators = created > 0
    firsts = first_pre[creators]
    first_depth = lcp[creators]  # depth of the parent
    parent_bfs = np.empty(n, dtype=np.int32)
    parent_bfs[0] = 0
    parent_bfs[bfs_of_pre[1:]] = bfs_of_pre[parent_pre[1:]]
    # Key of every node in breadth-first order: (depth, creator string), ascending.
    bfs_depth = np.concatenate(([0], depth[order]))
    bfs_creator = np.concatenate(([0], creator[order]))
    keys = bfs_depth * k + bfs_creator
    queries = first_depth * k + np.flatnonzero(creators)
    parent_bfs[bfs_of_pre[firsts]] = np.searchsorted(keys, queries, side="left") - 1
    parent_bfs[bfs_of_pre[firsts[first_depth == 0]]] = 0

    byte = np.empty(n, dtype=np.uint8)
    byte[0] = 0
    byte[1:] = byte_pre[order]
    terminal = np.zeros(k, dtype=np.int32)
    terminal[creators] = bfs_of_pre[firsts + created[creators] - 1]
    return ByteTrie(
        parent=parent_bfs,
        byte=byte,
        level_offsets=level_offsets,
        terminal=terminal,
        flat=flat,
        starts=starts,
        inverse=inverse,
    )
