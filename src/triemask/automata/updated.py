"""UpdatedTrieAutomaton: a base automaton, the edges removals cut and a delta automaton merged at lookup."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from ..base import ArgumentTypeError, StateError, ValueIndexError, as_bitmask_array, kernels, values_fingerprint
from .core import DEAD, kernel_fill, kernel_next_states, kernel_pairs, state_index
from .forced import forced_in_sorted
from .trie import TrieAutomaton

_EMPTY: npt.NDArray[np.int32] = np.zeros(0, dtype=np.int32)
_EMPTY.flags.writeable = False


@dataclass(frozen=True)
class CutEdges:
    """The base nodes that lost edges to the removals (ascending) and the tokens each lost, as
    one CSR: node ``nodes[k]`` loses ``tokens[offsets[k]:offsets[k + 1]]`` (ascending) and
    keeps its other edges, the base's own. All int32."""

    nodes: npt.NDArray[np.int32]
    offsets: npt.NDArray[np.int32]
    tokens: npt.NDArray[np.int32]

    def of(self, node: int) -> npt.NDArray[np.int32]:
        """The tokens node ``node`` lost (none where it was not cut)."""
        k = int(np.searchsorted(self.nodes, node))
        if k == len(self.nodes) or int(self.nodes[k]) != node:
            return _EMPTY
        return self.tokens[int(self.offsets[k]) : int(self.offsets[k + 1])]

    @property
    def nbytes(self) -> int:
        return self.nodes.nbytes + self.offsets.nbytes + self.tokens.nbytes


def _without(tokens: npt.NDArray[np.int32], cut: npt.NDArray[np.int32]) -> npt.NDArray[np.int32]:
    """``tokens`` (ascending) less ``cut`` (ascending, each one of them)."""
    if not len(cut):
        return tokens
    kept = np.ones(len(tokens), dtype=bool)
    kept[np.searchsorted(tokens, cut)] = False
    found: npt.NDArray[np.int32] = tokens[kept]
    return found


class UpdatedTrieAutomaton(TrieAutomaton):
    """A :class:`TrieAutomaton` made by :meth:`TrieAutomaton.with_values`: its base, the edges
    the removals cut from it and a delta automaton of the added ones, merged at lookup (see
    the module :mod:`triemask.sets.update`). The same masks as a full recompile of the new set;
    other state numbers (a pair of the parts' states). Immutable; :meth:`compacted`
    recompiles it into a plain automaton, and saving or pickling saves that. With the C
    extension its lookups run in one kernel over the parts (``base._native.updated_kernel``);
    the methods below are the reference."""

    __slots__ = (
        "_added",
        "_base",
        "_compact",
        "_compact_lock",
        "_cut",
        "_delta",
        "_keys",
        "_order",
        "_partner",
        "_recompiler",
        "_removed",
        "_removed_values",
    )

    def __init__(
        self,
        base: TrieAutomaton,
        delta: TrieAutomaton | None,
        cut: CutEdges,
        partner: npt.NDArray[np.int32],
        removed_indices: npt.NDArray[np.int64],
        removed_values: set[Any],
        added: Sequence[Any],
        compiler: Any,
    ) -> None:
        self._base, self._delta, self._cut = base, delta, cut
        self._removed, self._removed_values, self._added = removed_indices, frozenset(removed_values), tuple(added)
        self._recompiler = compiler  # compacted() recompiles with it
        self._compiler = weakref.ref(compiler)
        # per delta node, the base node spelling the same prefix (-1: none), for the pair states
        self._partner = partner
        self._num_nodes = base.num_nodes
        self._num_values = base.num_values - len(removed_indices) + len(added)
        self._meta, self._width, self._level_offsets = base._meta, base._width, base._level_offsets
        self._set_fingerprint = None
        self._kernel = self._patch_kernel()
        self._order: list[Any] | None = None  # the merged sorted values, made on first use
        self._keys: list[bytes] | None = None  # their bytes, for find_jump_forward_string
        self._compact: TrieAutomaton | None = None
        self._compact_lock = threading.Lock()

    def _patch_kernel(self) -> Any:
        """The C lookups over the parts (base, cut edges, delta), or None without the extension
        or where a part is not an eager trie or the states pass 2**31."""
        native, base, delta = kernels.KERNELS, self._base, self._delta
        eager = type(base) is TrieAutomaton and (delta is None or type(delta) is TrieAutomaton)
        if native is None or not eager or base._kernel is None or self.num_states >= (1 << 31) - 1:
            return None
        cut = self._cut
        delta_kernel = None if delta is None else delta._kernel
        return native.updated_kernel(
            base._kernel, delta_kernel, cut.nodes, cut.offsets, cut.tokens, self._partner, self.num_states
        )

    def parts(self) -> tuple[TrieAutomaton, frozenset[Any], frozenset[Any]]:
        """The base automaton, the values added to it and the values removed from it."""
        return self._base, frozenset(self._added), self._removed_values

    # ------------------------------------------------------------------ states

    def _split(self, state: Any) -> tuple[int, int]:
        """The parts' states of ``state``: [0, B) the base state alone, [B, B + D) the delta
        state alone, above a delta node with its partner (B, D: the parts' state counts)."""
        state = state_index(state)
        if not -1 <= state < self.num_states:
            raise StateError(
                f"state {state!r} is not a state of this automaton (DEAD or 0 <= state < {self.num_states})"
            )
        base_states, delta_states = self._base.num_states, self._delta_states
        if state < base_states:
            return state, DEAD
        if state < base_states + delta_states:
            return DEAD, state - base_states
        delta = state - base_states - delta_states
        return int(self._partner[delta]), delta

    def _join(self, base: int, delta: int) -> int:
        """The state of the pair; both at nodes, the base node is the delta node's partner."""
        if delta == DEAD:
            return base
        paired = base != DEAD and delta < len(self._partner)  # (a final state is in one part only)
        return self._base.num_states + delta + (self._delta_states if paired else 0)

    @property
    def _delta_states(self) -> int:
        return self._delta.num_states if self._delta is not None else 0

    def _split_many(self, states: Any) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
        """The parts' states of a batch of valid states (int64), or None when the batch is not
        a 1-D integer array of states (then the per-row path raises the typed error)."""
        given = np.asarray(states)
        if given.ndim != 1 or given.dtype.kind not in "iu" or given.size == 0:
            return None
        if int(given.min()) < -1 or int(given.max()) >= self.num_states:
            return None
        code = given.astype(np.int64)
        base_states, delta_states = self._base.num_states, self._delta_states
        alone = code < base_states + delta_states
        delta = np.where(alone, code - base_states, code - base_states - delta_states)
        delta[code < base_states] = DEAD
        base = np.where(code < base_states, code, DEAD)
        paired = ~alone
        base[paired] = self._partner[delta[paired]]
        return base, delta

    def _plain(self, base: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Which base states are live nodes the removals left as they were."""
        cut = self._cut.nodes
        if not len(cut):
            return base >= 0
        at = np.minimum(np.searchsorted(cut, base), len(cut) - 1)  # (isin sorts: slower here)
        plain: npt.NDArray[np.bool_] = (base >= 0) & (cut[at] != base)
        return plain

    @property
    def initial_state(self) -> int:
        return self._join(0, 0 if self._delta is not None else -1)

    @property
    def num_states(self) -> int:
        """The size of the state id space: the base's states, the delta's, and its nodes paired
        with their partners."""
        return self._base.num_states + self._delta_states + len(self._partner)

    @property
    def num_values(self) -> int:
        return self._num_values

    @property
    def memory_bytes(self) -> int:
        """The base's arrays (shared with it), the delta's, the cut edges and the C kernel's
        own table (a bit per base node)."""
        info = self._kernel.patch_info() if self._kernel is not None else None
        own = self._cut.nbytes + self._removed.nbytes + (info["bytes"] if info is not None else 0)
        return self._base.memory_bytes + own + (self._delta.memory_bytes if self._delta is not None else 0)

    @property
    def accepting_nodes(self) -> npt.NDArray[np.int32]:
        raise ArgumentTypeError("an updated automaton's states are pairs: call compacted() for accepting_nodes")

    def allowed_token_ids(self, state: int) -> npt.NDArray[np.int32]:
        """Ids of the tokens allowed in ``state``, ascending (read-only)."""
        base, delta = self._split(state)
        parts: list[npt.NDArray[np.int32]] = []
        if base >= 0:
            parts.append(_without(self._base.allowed_token_ids(base), self._cut.of(base)))
        if delta >= 0 and self._delta is not None:
            parts.append(self._delta.allowed_token_ids(delta))
        if len(parts) < 2:
            return parts[0] if parts else _EMPTY
        return np.union1d(parts[0], parts[1]).astype(np.int32)

    def _next_state_reference(self, state: int, token_id: int) -> int:
        base, delta = self._split(state)
        token_id = state_index(token_id, "token ids")
        following_base = self._next_base(base, token_id) if base >= 0 else DEAD
        following_delta = self._delta.next_state(delta, token_id) if delta >= 0 and self._delta is not None else DEAD
        if following_base == DEAD and following_delta == DEAD:
            return DEAD
        return self._join(following_base, following_delta)

    def next_states(self, states: npt.ArrayLike, token_ids: npt.ArrayLike) -> npt.NDArray[np.int32]:
        """Vectorised :meth:`next_state`: one batch call per part (the rows at cut
        nodes one by one). Past 2**31 states the result is int64."""
        found = kernel_next_states(self._kernel, states, token_ids)
        if found is not None:
            return found
        split = self._split_many(states)
        tokens = np.asarray(token_ids)
        if split is None or tokens.shape != split[0].shape or tokens.dtype.kind not in "iu" or int(tokens.min()) < 0:
            pairs = zip(np.asarray(states).tolist(), tokens.tolist(), strict=True)
            found = np.asarray([self.next_state(s, t) for s, t in pairs], dtype=np.int64)
        else:
            base, delta = split
            tokens = tokens.astype(np.int64)
            after_base = np.full(len(base), DEAD, dtype=np.int64)
            plain = self._plain(base)
            after_base[plain] = self._base.next_states(base[plain], tokens[plain])
            for i in np.flatnonzero((base >= 0) & ~plain).tolist():
                after_base[i] = self._next_base(int(base[i]), int(tokens[i]))
            after_delta = np.full(len(base), DEAD, dtype=np.int64)
            if self._delta is not None:
                live = delta >= 0
                after_delta[live] = self._delta.next_states(delta[live], tokens[live])
            paired = (after_base != DEAD) & (after_delta < len(self._partner))
            found = np.where(
                after_delta == DEAD, after_base, self._base.num_states + self._delta_states * paired + after_delta
            )
        return cast(npt.NDArray[np.int32], found.astype(np.int32) if self.num_states < 1 << 31 else found)

    def allowed_token_pairs(
        self, states: Sequence[int] | npt.NDArray[np.integer[Any]]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]:
        pairs = kernel_pairs(self._kernel, states)
        if pairs is not None:
            return pairs
        split = self._split_many(states)
        if split is None:  # per row: the typed errors, and the empty batch
            found = [self.allowed_token_ids(s) for s in np.asarray(states).tolist()]
            rows = np.repeat(np.arange(len(found), dtype=np.int64), [len(f) for f in found])
            return rows, (np.concatenate(found).astype(np.int32) if found else _EMPTY.copy())
        base, delta = split
        rows_found: list[npt.NDArray[np.int64]] = []
        tokens_found: list[npt.NDArray[Any]] = []
        is_plain = self._plain(base)
        plain = np.flatnonzero(is_plain)
        if len(plain):
            r, t = self._base.allowed_token_pairs(base[plain])
            rows_found.append(plain[r])
            tokens_found.append(t)
        for i in np.flatnonzero((base >= 0) & ~is_plain).tolist():
            kept = _without(self._base.allowed_token_ids(int(base[i])), self._cut.of(int(base[i])))
            rows_found.append(np.full(len(kept), i, dtype=np.int64))
            tokens_found.append(kept)
        live = np.flatnonzero(delta >= 0)
        if len(live) and self._delta is not None:
            r, t = self._delta.allowed_token_pairs(delta[live])
            rows_found.append(live[r])
            tokens_found.append(t)
        if not rows_found:
            return np.zeros(0, dtype=np.int64), _EMPTY.copy()
        stride = 32 * self._width  # one key per (row, token): sorted, then deduplicated
        keys = np.sort(np.concatenate(rows_found) * stride + np.concatenate(tokens_found).astype(np.int64))
        keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
        return keys // stride, (keys % stride).astype(np.int32)

    def _next_base(self, base: int, token_id: int) -> int:
        """The base part's state after ``token_id`` from live node ``base``."""
        cut = self._cut.of(base)
        i = int(np.searchsorted(cut, token_id))
        if i < len(cut) and cut[i] == token_id:
            return DEAD
        return self._base.next_state(base, token_id)

    def _fill_row(self, row: npt.NDArray[np.int32], state: int) -> None:
        base, delta = self._split(state)
        if base >= 0:
            self._base.fill_row(row[None, :], base)  # the base's own (C) fill, less the cut tokens
            cut = self._cut.of(base)
            np.bitwise_and.at(row.view(np.uint32), cut >> 5, ~np.left_shift(np.uint32(1), (cut & 31).astype(np.uint32)))
        else:
            row.fill(0)
        if delta >= 0 and self._delta is not None:  # OR in the delta's row (its own C fill)
            extra = np.empty((1, len(row)), dtype=np.int32)
            self._delta.fill_row(extra, delta)
            row |= extra[0]

    def _fill_bitmask_reference(self, bitmask: Any, states: Any, *, rows: npt.ArrayLike | None = None) -> None:
        if kernel_fill(self._kernel, bitmask, states, rows, self._meta.vocab_size):
            return
        array = as_bitmask_array(bitmask, self._meta.vocab_size)
        split = self._split_many(states)
        values: list[int] = []
        if split is None:  # per row: every state checked (the typed error) before any row is written
            values = [state_index(s) for s in (states.tolist() if isinstance(states, np.ndarray) else list(states))]
            for state in values:
                self._split(state)
        count = len(split[0]) if split is not None else len(values)
        targets = list(range(count)) if rows is None else self._few_rows(rows, count, array.shape[0])
        if rows is None and count > array.shape[0]:
            raise StateError(f"{count} states but the bitmask has only {array.shape[0]} rows")
        if split is None:
            for target, state in zip(targets, values, strict=True):
                self._fill_row(array[target], state)
            return
        base, delta = split
        at = np.asarray(targets, dtype=np.int64)
        plain = self._plain(base)
        if plain.any():  # the base's own batch fill for the rows it answers alone
            self._base.fill_bitmask(array, base[plain], rows=at[plain])
        for i in np.flatnonzero(~plain).tolist():  # DEAD or a cut node
            self._fill_row(array[at[i]], self._join(int(base[i]), DEAD))
        live = np.flatnonzero(delta >= 0)
        if len(live) and self._delta is not None:  # OR in the delta's tokens: few, set bit by bit
            r, t = self._delta.allowed_token_pairs(delta[live])
            np.bitwise_or.at(
                array.view(np.uint32), (at[live][r], t >> 5), np.left_shift(np.uint32(1), (t & 31).astype(np.uint32))
            )

    # ------------------------------------------------------------------ values

    def _value_of_parts(self, state: int) -> Any:
        base, delta = self._split(state)
        if base >= 0:
            index = self._base.value_index(base)
            if index is not None and not self._removed_index(index):
                return self._base.value(index)
        if delta >= 0 and self._delta is not None:
            return self._delta.value_of(delta)
        return None

    def _removed_index(self, index: int) -> bool:
        i = int(np.searchsorted(self._removed, index))
        return i < len(self._removed) and int(self._removed[i]) == index

    def is_accepting(self, state: int) -> bool:
        return self._value_of_parts(state) is not None

    def is_final(self, state: int) -> bool:
        base, delta = self._split(state)
        if base >= 0 and self._base.is_final(base):
            return not self._removed_index(base - self._base.num_nodes)
        return delta >= 0 and self._delta is not None and self._delta.is_final(delta)

    def value_of(self, state: int) -> str | bytes | None:
        found: str | bytes | None = self._value_of_parts(state)
        return found

    def values(self) -> list[str | bytes]:
        with self._compact_lock:
            if self._order is None:
                kept = [v for v in self._base.values() if v not in self._removed_values]
                # str order is code point order, which is UTF-8's byte order: no key needed, and
                # the base's values come sorted (a near-sorted run is linear for Python's sort)
                self._order = sorted(kept + list(self._added))
            return list(self._order)

    def forced_bytes(self, state: int) -> bytes:
        """The bytes every continuation from ``state`` begins with (see
        :meth:`TrieAutomaton.forced_bytes`): the common prefix of the updated set's values that
        begin with the state's prefix (read from whichever part is still in a node)."""
        base, delta = self._split(state)
        if base >= 0 and base < self._base.num_nodes:
            prefix = self._base._prefix(base)
        elif delta >= 0 and self._delta is not None and delta < self._delta.num_nodes and base < 0:
            prefix = self._delta._prefix(delta)
        else:
            return b""  # final or DEAD
        if self._keys is None:
            self._keys = [v.encode() if isinstance(v, str) else v for v in self.values()]
        return forced_in_sorted(self._keys, prefix)

    def value(self, index: int) -> str | bytes:
        index = state_index(index, "value indices")
        if not 0 <= index < self._num_values:
            raise ValueIndexError(f"value index {index} is outside [0, {self._num_values})")
        return self.values()[index]

    @property
    def set_fingerprint(self) -> str:
        if self._set_fingerprint is None:
            values: Any = self.values()
            self._set_fingerprint = values_fingerprint(values)
        return self._set_fingerprint

    # ------------------------------------------------------------------ compaction

    def compacted(self) -> TrieAutomaton:
        """The same set recompiled into a plain automaton (states renumbered; made once)."""
        if self._compact is None:
            values: Any = self.values()  # (takes the lock itself)
            with self._compact_lock:
                if self._compact is None:
                    self._compact = self._recompiler.compile(values, eos=self._meta.eos)
        return self._compact

    def edge_arrays(self) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        raise ArgumentTypeError("an updated automaton merges its parts at lookup: call compacted() for edge arrays")

    def file_parts(self) -> tuple[str, dict[str, Any], dict[str, npt.NDArray[Any]]]:
        """Those of :meth:`compacted`: saving or pickling stores a plain automaton (its
        states renumbered)."""
        return self.compacted().file_parts()

    def stats(self) -> dict[str, Any]:
        return {
            "layout": "updated",
            "values": self._num_values,
            "base_values": self._base.num_values,
            "added": len(self._added),
            "removed": len(self._removed),
            "cut_nodes": len(self._cut.nodes),
            "cut_tokens": len(self._cut.tokens),
            "states": self.num_states,
            "memory_bytes": self.memory_bytes,
            "eos": self._meta.eos,
            "vocab_size": self._meta.vocab_size,
            "vocab_fingerprint": self._meta.vocab_fingerprint,
        }

    def __repr__(self) -> str:
        return (
            f"UpdatedTrieAutomaton(values={self._num_values}, base_values={self._base.num_values}, "
            f"added={len(self._added)}, removed={len(self._removed)}, eos={self._meta.eos})"
        )
