"""Incremental updates: ``automaton.with_values(added=..., removed=...)`` without recompiling.

An :class:`UpdatedTrieAutomaton` is its base automaton (shared, unchanged), tombstones for
the removed values, and a small delta automaton compiled from the added values alone,
merged at lookup. A state is a pair (base state, delta state) in one integer; a token is
allowed when the base allows it (less the edges into tombstoned subtries) or the delta
does, which is exactly the set a full recompile allows: the union of the two tries' token
paths is the trie of the union of the sets, and the tombstones remove the paths whose
every value was removed. The costs are the change's: compiling the added values, and per
removed value a walk down its path and up its now-empty suffix (single-byte tokens give
each node's children); the edges of the nodes up to a token's length above a removed
subtrie are rewritten without the edges into it. Updates accumulate against the same base;
when the change grows past :data:`COMPACT_FRACTION` of the base (or the vocabulary lacks a
single-byte token the walk needs) the result is a full recompile instead.

With the C extension, a step, a fill and the batch calls over an updated automaton run in
its own kernel (the parts' kernels, the rewritten nodes, and the few pairs where both parts
are at nodes merged once when it is built: one lookup a step, as on a plain automaton);
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
    DagAutomaton,
    DagLanguage,
    LazyTrieAutomaton,
    RewrittenEdges,
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
    candidates = sorted(removing | adding | set(prior_removed), key=repr)  # one walk for all
    paths, lengths = _walks(base, candidates, byte_tokens)
    ends = paths[np.arange(len(candidates)), lengths]
    found = (ends >= 0) & (_indices(base, np.maximum(ends, 0)) >= 0)
    in_base = {v for v, hit in zip(candidates, found.tolist(), strict=True) if hit}
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
    delta = compiler.compile(delta_values, eos=base.eos) if delta_values else None
    chosen = np.asarray([i for i, v in enumerate(candidates) if v in tombstoned], dtype=np.int64)
    rewritten, removed_indices = _tombstones(base, paths[chosen], lengths[chosen], byte_tokens)
    return UpdatedTrieAutomaton(base, delta, rewritten, removed_indices, tombstoned, delta_values, compiler)


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
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Each value's path down the base's trie, one byte (token) at a time for all values at
    once: ``paths[i, d]`` is the node after the first ``d`` bytes of value ``i`` (DEAD once it
    leaves the trie), and ``lengths[i]`` its length in bytes."""
    raws = [v.encode() if isinstance(v, str) else bytes(v) for v in values]
    lengths = np.asarray([len(raw) for raw in raws], dtype=np.int64)
    longest = int(lengths.max(initial=0))
    padded = np.zeros((len(raws), longest), dtype=np.uint8)
    starts = np.cumsum(lengths) - lengths
    rows = np.repeat(np.arange(len(raws)), lengths)
    padded[rows, np.arange(len(rows)) - starts[rows]] = np.frombuffer(b"".join(raws), dtype=np.uint8)
    tokens = byte_tokens[padded]
    native, kernel = kernels.KERNELS, native_kernel(base)
    if native is not None and kernel is not None:
        walked = native.walk_paths(kernel, tokens, lengths, base.initial_state)
        return np.frombuffer(walked, dtype=np.int64).reshape(len(raws), longest + 1), lengths
    return _walks_reference(base, tokens, lengths), lengths


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

    def arrays(self) -> tuple[npt.NDArray[np.int64], ...]:
        """The fields in order (``dataclasses.astuple`` would deep-copy the arrays)."""
        return self.nodes, self.parents, self.depths, self.indices, self.removed


def _tombstones(
    base: TrieAutomaton,
    paths: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    byte_tokens: npt.NDArray[np.int64],
) -> tuple[RewrittenEdges, npt.NDArray[np.int64]]:
    """The rewritten edges of the base nodes the removals change, and the removed values'
    indices in the base (``paths``: the removed values' walks, see :func:`_walks`).

    A node is dead when no remaining base value lies at or below it: its value (if any) is
    removed and all its children (the distinct targets of its single-byte tokens) are dead,
    counted from the deepest nodes up. A live node on such a path is rewritten when one of its
    edges leads into a dead node (those edges go), or when it is a removed value's own node
    (EOS goes). The pass runs in C (``tombstone_edges``), else in NumPy (the reference)."""
    removed, _ = _distinct(_indices(base, paths[np.arange(len(paths)), lengths]))
    depth = np.broadcast_to(np.arange(paths.shape[1]), paths.shape)
    on_path = depth <= lengths[:, None]
    flat_nodes, flat_depths = paths[on_path], depth[on_path]
    flat_parents = np.where(flat_depths > 0, np.roll(paths, 1, axis=1)[on_path], -1)
    nodes, first = _distinct(flat_nodes)
    on_paths = _PathNodes(nodes, flat_parents[first], flat_depths[first], _indices(base, nodes), removed)
    # 1 for the single-byte tokens (one per byte), over every id an edge may hold
    single = np.zeros(32 * bitmask_width(base.vocab_size) + 1, dtype=np.uint8)
    single[byte_tokens[byte_tokens >= 0]] = 1
    eos = np.asarray(base.eos_token_ids, dtype=np.int64)
    native, kernel = kernels.KERNELS, native_kernel(base)
    if native is not None and kernel is not None:
        found = native.tombstone_edges(kernel, *on_paths.arrays(), single, eos, base.initial_state)
        return RewrittenEdges(*(np.frombuffer(part, dtype=np.int32) for part in found)), removed
    return _tombstones_reference(base, on_paths, single, eos), removed


def _tombstones_reference(
    base: TrieAutomaton, on_paths: _PathNodes, single: npt.NDArray[np.uint8], eos: npt.NDArray[np.int64]
) -> RewrittenEdges:
    """``tombstone_edges`` in NumPy: the rewritten nodes and the edges they keep. Every
    node's edges are gathered in one batch."""
    nodes, node_parents, node_depths, index, removed_indices = on_paths.arrays()
    offsets, all_tokens, all_dests = base.edge_arrays()
    lo, hi = offsets[nodes], offsets[nodes + 1]
    counts = (hi - lo).astype(np.int64)
    rows = np.repeat(np.arange(len(nodes), dtype=np.int64), counts)
    at = np.arange(int(counts.sum())) + np.repeat(lo - (np.cumsum(counts) - counts), counts)
    tokens, dests = all_tokens[at], all_dests[at]
    keeps_value = (index >= 0) & ~_member(index, removed_indices)
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
    into_dead = dead_table[dests]
    is_dead = dead_table[nodes]
    own = (index >= 0) & _member(index, removed_indices)  # a removed value's node: no more EOS
    is_eos = _member(tokens, np.sort(eos))
    drop = into_dead | (own[rows] & is_eos)
    changed = (np.bincount(rows[drop], minlength=len(nodes)) > 0) & ~is_dead
    kept = ~drop & changed[rows]
    ends = np.cumsum(np.bincount(rows[kept], minlength=len(nodes))[changed])
    return RewrittenEdges(
        nodes[changed].astype(np.int32),
        np.concatenate(([0], ends)).astype(np.int32),
        tokens[kept].astype(np.int32),
        dests[kept].astype(np.int32),
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
