"""Incremental updates: ``automaton.with_values(added=..., removed=...)`` without recompiling.

An :class:`UpdatedTrieAutomaton` is its base automaton (shared, unchanged), the edges the
removals cut from it, and a small delta automaton compiled from the added values alone,
merged at lookup. A state is a pair (base state, delta state) in one integer (see
:class:`UpdatedTrieAutomaton`); a token is
allowed when the base allows it (less the cut edges, those into tombstoned subtries) or the
delta does, which is exactly the set a full recompile allows: the union of the two tries'
token paths is the trie of the union of the sets, and the cuts remove the paths whose every
value was removed. The costs are the change's: compiling the added values, and per removed
value a walk down its path and up its now-empty suffix (single-byte tokens give each node's
children); the nodes up to a token's length above a removed subtrie lose the edges into it,
and only those edges are listed (a node keeps the base's row, less them). Updates accumulate
against the same base; when the change grows past :data:`COMPACT_FRACTION` of the base (or
the vocabulary lacks a single-byte token the walk needs) the result is a full recompile
instead.

With the C extension, the walks, the cut pass and the delta's partners run in the kernel
(``walk_paths``, ``tombstone_edges``, ``partner_nodes``), and a step, a fill and the batch
calls over an updated automaton in its own kernel over the parts (the base's lookup less the
cut tokens, the delta's, joined);
:meth:`UpdatedTrieAutomaton.compacted` recompiles the current set into a plain automaton
(new state numbers).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ..automata import (
    DEAD,
    CutEdges,
    DagAutomaton,
    DagLanguage,
    LazyTrieAutomaton,
    TrieAutomaton,
    UpdatedTrieAutomaton,
    native_kernel,
)
from ..base import ArgumentTypeError, ValueSetError, bitmask_width, kernels
from ..vocab import Vocabulary


class Compiles(Protocol):
    """What an update needs of its compiler (:class:`~triemask.sets.SetCompiler` is one)."""

    @property
    def vocab(self) -> Vocabulary: ...

    def single_byte_tokens(self) -> npt.NDArray[np.int64]: ...

    def compile(self, values: Any, *, eos: bool = True, layout: str = "trie") -> TrieAutomaton: ...


COMPACT_FRACTION = 0.05
"""Above this many changed values (added + removed, cumulative) per value of the base, an
update recompiles the whole set instead of merging at lookup."""


def _as_values(values: Iterable[Any], are_str: bool, what: str) -> list[Any]:
    if isinstance(values, str | bytes):
        raise ValueSetError(
            f"{what} must be an iterable of values, got a single {type(values).__name__}: wrap it in a list"
        )
    items = list(values)
    kind = str if are_str else bytes
    for i, value in enumerate(items):
        if not isinstance(value, kind):
            raise ValueSetError(
                f"{what}[{i}] is {type(value).__name__} {value!r:.40}; this set's values are {kind.__name__}"
            )
    return items


def updated(
    automaton: TrieAutomaton, added: Iterable[Any], removed: Iterable[Any], compiler: Compiles
) -> TrieAutomaton:
    """The automaton of ``automaton``'s set plus ``added`` minus ``removed`` (see the module)."""
    if compiler.vocab.fingerprint != automaton.vocab_fingerprint:
        raise ArgumentTypeError("with_values: the compiler's vocabulary is not the one this automaton was compiled for")
    if isinstance(automaton, UpdatedTrieAutomaton):
        base, kept_added, prior_removed = automaton.parts()
    else:
        base, kept_added, prior_removed = automaton, frozenset(), frozenset()
    if isinstance(base, DagLanguage) and base.pattern is not None:
        raise ArgumentTypeError("with_values updates sets of values, not the language of a pattern")
    are_str = base.values_are_str
    adding, removing = set(_as_values(added, are_str, "added")), set(_as_values(removed, are_str, "removed"))
    if not adding and not removing:
        return automaton
    byte_tokens = compiler.single_byte_tokens()
    # merged at lookup: plain (eager) tries, with a single-byte token for every byte (the walks
    # below read a node's children from them); any other set is compiled whole
    if type(base) is not TrieAutomaton or (byte_tokens < 0).any():
        return _recompiled(base, automaton, adding, removing, compiler)
    # one walk for all (one type: str or bytes); the delta's values' walks give its partners
    candidates = sorted(removing | adding | set(prior_removed) | set(kept_added))
    paths, lengths, ends = _walks(base, candidates, byte_tokens)
    in_base = {v for v, index in zip(candidates, ends.tolist(), strict=True) if index >= 0}
    for value in sorted(removing, key=repr):
        if value not in kept_added and (value not in in_base or value in prior_removed):
            raise ValueSetError(f"removed value {value!r:.60} is not in the set")
    tombstoned = (set(prior_removed) | (removing & in_base)) - (adding & in_base)
    delta_values = sorted((set(kept_added) - removing) | (adding - in_base))
    if base.num_values - len(tombstoned) + len(delta_values) == 0:
        raise ValueSetError("with_values would leave an empty set")
    change = len(tombstoned) + len(delta_values)
    if change == 0:
        return base
    if change > COMPACT_FRACTION * base.num_values:
        return _recompiled(base, automaton, adding, removing, compiler)
    row = {v: i for i, v in enumerate(candidates)}
    chosen = np.asarray([row[v] for v in sorted(tombstoned)], dtype=np.int64)
    # (the cut pass first, while the walks' nodes of the base are still in the caches)
    cut, removed_indices = _tombstones(base, paths[chosen], lengths[chosen], byte_tokens)
    delta = compiler.compile(delta_values, eos=base.eos) if delta_values else None
    partner = _partners(delta, delta_values, byte_tokens, paths[[row[v] for v in delta_values]])
    return UpdatedTrieAutomaton(base, delta, cut, partner, removed_indices, tombstoned, delta_values, compiler)


def _partners(
    delta: TrieAutomaton | None,
    delta_values: list[Any],
    byte_tokens: npt.NDArray[np.int64],
    base_paths: npt.NDArray[np.int64],
) -> npt.NDArray[np.int32]:
    """Per delta node, the base node spelling the same prefix (-1: none): the delta values'
    walks down the delta, node by node against their walks down the base (``base_paths``,
    a row each). In C (``partner_nodes``), else in NumPy, the reference."""
    if delta is None:
        return np.zeros(0, dtype=np.int32)
    native, kernel = kernels.KERNELS, native_kernel(delta)
    if native is not None and kernel is not None:
        raws = [v.encode() if isinstance(v, str) else bytes(v) for v in delta_values]
        found = native.partner_nodes(kernel, raws, byte_tokens, np.ascontiguousarray(base_paths, dtype=np.int64))
        return np.frombuffer(found, dtype=np.int32)
    delta_paths, lengths, _ = _walks(delta, delta_values, byte_tokens)
    on_path = np.arange(delta_paths.shape[1]) <= lengths[:, None]
    partner = np.full(delta.num_nodes, DEAD, dtype=np.int32)
    partner[delta_paths[on_path]] = base_paths[:, : delta_paths.shape[1]][on_path]
    return partner


def _single(byte_tokens: npt.NDArray[np.int64]) -> npt.NDArray[np.uint8]:
    """1 for the single-byte tokens, by token id up to the largest of them (the C passes
    read a node's edges only that far)."""
    singles = byte_tokens[byte_tokens >= 0]
    single = np.zeros(int(singles.max(initial=-1)) + 1, dtype=np.uint8)
    single[singles] = 1
    return single


def _recompiled(
    base: TrieAutomaton, current: TrieAutomaton, adding: set[Any], removing: set[Any], compiler: Compiles
) -> TrieAutomaton:
    """The new set compiled whole, in the base's layout."""
    values = set(current.values())
    missing = sorted(removing - values, key=repr)
    if missing:
        raise ValueSetError(f"removed value {missing[0]!r:.60} is not in the set")

    layout = "lazy" if isinstance(base, LazyTrieAutomaton) else "dag" if isinstance(base, DagAutomaton) else "trie"
    new: Any = sorted((values - removing) | adding, key=repr)
    return compiler.compile(new, eos=base.eos, layout=layout)


def _walks(
    base: TrieAutomaton, values: Sequence[Any], byte_tokens: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Each value's path down the base's trie, one byte (token) at a time for all values at
    once: ``paths[i, d]`` is the node after the first ``d`` bytes of value ``i`` (DEAD once it
    leaves the trie), ``lengths[i]`` its length in bytes and ``ends[i]`` the index of the base
    value it is (-1: none)."""
    raws = [v.encode() if isinstance(v, str) else bytes(v) for v in values]
    native, kernel = kernels.KERNELS, native_kernel(base)
    if native is not None and kernel is not None:
        paths, lengths, ends = native.walk_paths(kernel, raws, byte_tokens, base.initial_state, *_value_ends(base))
        found = np.frombuffer(lengths, dtype=np.int64)
        shape = (len(raws), int(found.max(initial=0)) + 1)
        return np.frombuffer(paths, dtype=np.int64).reshape(shape), found, np.frombuffer(ends, dtype=np.int64)
    lengths = np.asarray([len(raw) for raw in raws], dtype=np.int64)
    longest = int(lengths.max(initial=0))
    padded = np.zeros((len(raws), longest), dtype=np.uint8)
    starts = np.cumsum(lengths) - lengths
    rows = np.repeat(np.arange(len(raws)), lengths)
    padded[rows, np.arange(len(rows)) - starts[rows]] = np.frombuffer(b"".join(raws), dtype=np.uint8)
    paths = _walks_reference(base, byte_tokens[padded], lengths)
    last = paths[np.arange(len(raws)), lengths]
    return paths, lengths, np.where(last >= 0, _indices(base, np.maximum(last, 0)), -1)


def _value_ends(base: TrieAutomaton) -> tuple[int, npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """Where the base's values end, for the C passes: the EOS id whose edge leads to each
    value's final state (-1 without EOS), and the nodes each value ends at (ascending) with its
    index."""
    terminal_nodes, terminal_values = (np.ascontiguousarray(a, dtype=np.int32) for a in base.terminal_arrays())
    return (int(base.eos_token_ids[0]) if base.eos else -1), terminal_nodes, terminal_values


def _walks_reference(
    base: TrieAutomaton, tokens: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """``walk_paths`` in NumPy: one batch step per depth."""
    longest = tokens.shape[1]
    paths = np.full((len(tokens), longest + 1), DEAD, dtype=np.int64)
    paths[:, 0] = base.initial_state
    for depth in range(longest):
        moving = np.flatnonzero((lengths > depth) & (paths[:, depth] != DEAD))
        paths[moving, depth + 1] = base.next_states(paths[moving, depth], tokens[moving, depth])
    return paths


@dataclass(frozen=True)
class _PathNodes:
    """The nodes on the removed values' paths (ascending, distinct), each with its parent
    (-1 for the root), depth and value index (-1: none), and the removed values' indices."""

    nodes: npt.NDArray[np.int64]
    parents: npt.NDArray[np.int64]
    depths: npt.NDArray[np.int64]
    indices: npt.NDArray[np.int64]
    removed: npt.NDArray[np.int64]


def _tombstones(
    base: TrieAutomaton,
    paths: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    byte_tokens: npt.NDArray[np.int64],
) -> tuple[CutEdges, npt.NDArray[np.int64]]:
    """The edges the removals cut from the base and the removed values' indices in it, ascending
    (``paths``: the removed values' walks, see :func:`_walks`).

    A node is dead when no remaining base value lies at or below it: its value (if any) is
    removed and all its children (the distinct targets of its single-byte tokens) are dead,
    counted from the deepest nodes up. A live node on such a path loses its edges into dead
    nodes, and a removed value's own node its EOS. Only the lost tokens are listed: the
    node's other edges stay the base's. The pass runs in C (``tombstone_edges``), else in
    NumPy (the reference)."""
    eos = np.asarray(base.eos_token_ids, dtype=np.int64)
    native, kernel = kernels.KERNELS, native_kernel(base)
    if native is not None and kernel is not None:
        walks, single = np.ascontiguousarray(paths), _single(byte_tokens)
        *cut, removed = native.tombstone_edges(
            kernel, walks, lengths, single, eos, *_value_ends(base), base.initial_state
        )
        return CutEdges(*(np.frombuffer(part, dtype=np.int32) for part in cut)), np.frombuffer(removed, dtype=np.int64)
    # 1 for the single-byte tokens (one per byte), over every id an edge may hold
    single = np.zeros(32 * bitmask_width(base.vocab_size) + 1, dtype=np.uint8)
    single[byte_tokens[byte_tokens >= 0]] = 1
    removed, _ = _distinct(_indices(base, paths[np.arange(len(paths)), lengths]))
    depth = np.broadcast_to(np.arange(paths.shape[1]), paths.shape)
    on_path = depth <= lengths[:, None]
    flat_nodes, flat_depths = paths[on_path], depth[on_path]
    flat_parents = np.where(flat_depths > 0, np.roll(paths, 1, axis=1)[on_path], -1)
    nodes, first = _distinct(flat_nodes)
    on_paths = _PathNodes(nodes, flat_parents[first], flat_depths[first], _indices(base, nodes), removed)
    return _tombstones_reference(base, on_paths, single, eos), removed


def _tombstones_reference(
    base: TrieAutomaton, on_paths: _PathNodes, single: npt.NDArray[np.uint8], eos: npt.NDArray[np.int64]
) -> CutEdges:
    """``tombstone_edges`` in NumPy: the cut nodes and the tokens they lose. Every node's
    edges are gathered in one batch."""
    nodes, node_parents, node_depths, index = on_paths.nodes, on_paths.parents, on_paths.depths, on_paths.indices
    offsets, all_tokens, all_dests = base.edge_arrays()
    lo, hi = offsets[nodes], offsets[nodes + 1]
    counts = (hi - lo).astype(np.int64)
    rows = np.repeat(np.arange(len(nodes), dtype=np.int64), counts)
    at = np.arange(int(counts.sum())) + np.repeat(lo - (np.cumsum(counts) - counts), counts)
    tokens, dests = all_tokens[at], all_dests[at]
    keeps_value = (index >= 0) & ~_member(index, on_paths.removed)
    stride = base.num_states + 1
    children = np.bincount(rows, weights=single[tokens], minlength=len(nodes)).astype(np.int64)
    # a node can die only if each of its children lies on a removed path; the others live
    path_children = np.bincount(np.searchsorted(nodes, node_parents[node_parents >= 0]), minlength=len(nodes))
    maybe = np.flatnonzero(~keeps_value & (children <= path_children) & (nodes != base.initial_state))
    maybe = maybe[np.argsort(-node_depths[maybe], kind="stable")]  # the deepest first
    dead: set[int] = set()
    dead_children: dict[int, int] = {}
    for node, parent, wanted in zip(
        nodes[maybe].tolist(), node_parents[maybe].tolist(), children[maybe].tolist(), strict=True
    ):
        if dead_children.get(node, 0) == wanted:  # every child dead (a leaf has none)
            dead.add(node)
            dead_children[parent] = dead_children.get(parent, 0) + 1
    dead_table = np.zeros(stride, dtype=bool)  # by state: one gather tells the edges into dead nodes
    dead_table[np.fromiter(dead, dtype=np.int64, count=len(dead))] = True
    own = (index >= 0) & _member(index, on_paths.removed)  # a removed value's node: no more EOS
    drop = (dead_table[dests] | (own[rows] & _member(tokens, np.sort(eos)))) & ~dead_table[nodes][rows]
    lost = np.bincount(rows[drop], minlength=len(nodes))
    return CutEdges(
        nodes[lost > 0].astype(np.int32),
        np.concatenate(([0], np.cumsum(lost[lost > 0]))).astype(np.int32),
        tokens[drop].astype(np.int32),
    )


def _distinct(items: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The distinct items ascending and where each first occurs: ``np.unique(items,
    return_index=True)`` without its first call's import of ``numpy.ma`` (10 ms, in the middle
    of what should be a cheap update; ``np.isin`` imports it too)."""
    order = np.argsort(items, kind="stable")
    ordered = items[order]
    first = np.ones(len(ordered), dtype=bool)
    first[1:] = ordered[1:] != ordered[:-1]
    return ordered[first], order[first]


def _member(items: npt.NDArray[np.int64], ordered: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Which items are in ``ordered`` (ascending): ``np.isin`` without the same import."""
    if not len(ordered):
        return np.zeros(len(items), dtype=bool)
    at = np.minimum(np.searchsorted(ordered, items), len(ordered) - 1)
    found: npt.NDArray[np.bool_] = ordered[at] == items
    return found


def _indices(base: TrieAutomaton, nodes: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The index of the value ending at each node, -1 where none does."""
    if base.eos and len(nodes):
        finals = base.next_states(nodes, np.full(len(nodes), base.eos_token_ids[0], dtype=np.int64))
        return np.where(finals == DEAD, -1, finals.astype(np.int64) - base.num_nodes)
    found = [base.value_index(int(node)) for node in nodes.tolist()]
    return np.asarray([-1 if i is None else i for i in found], dtype=np.int64)
