"""The decoding engine of a mixed schema: configurations entered, fed and filled."""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from ..automata import DEAD
from ..base import BoundedLRU
from .fields import Field
from .structure import STRUCT, Configuration, value_end_offsets, value_start_offsets
from .support import VocabularySupport

EXIT_ROWS_BYTES = 16 << 20
"""Bound, per compiled schema, on the tokens that leave a value which switches schemas (a
tool's name, a union's discriminator), kept for every request by the value and the output
before it (:meth:`SchemaEngine._switch_exits`)."""
KEPT_AFTER_BYTES = 256 << 10
"""Bound, per compiled schema, on the configurations kept after the texts it was fed from its
start (:meth:`SchemaEngine._kept_after`: a union's choice, a tool's arguments)."""
_AFTER_BYTES = 4096  # (a kept entry's size beside its text: the configurations' matchers)
_TOKENS_BYTES = 64  # (an exit row's beside its key's bytes and its array's)


class SchemaEngine:
    """The decoding half of :class:`CompiledSchema` (its base class): configurations entered,
    fed through tokens and filled into rows, read by :class:`SchemaMatcher`. The fields are
    the compiled schema's, set by its constructor and its loader."""

    _fields: tuple[Field, ...]
    _grammar: Any
    _support: VocabularySupport
    _crossing: frozenset[int]
    _fields_by_prefix: dict[int, list[int]]
    _starts_first: bytes
    # under _kept_lock: by field, node and output before the value, a row's words and their bits
    _exit_rows: BoundedLRU[tuple[int, int, bytes], tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]]
    _kept: BoundedLRU[bytes, list[Configuration]]  # under _kept_lock
    _kept_lock: threading.Lock

    def _initial(self) -> list[Configuration]:
        import xgrammar

        return [
            Configuration(self, xgrammar.GrammarMatcher(self._grammar, max_rollback_tokens=-1), STRUCT, 0, b"", None)
        ]

    def _exit(self, matcher: Any, k: int, node: int, value_start: bytes) -> list[Configuration]:
        """Configurations just after field ``k``'s value, completed at ``node``
        (``value_start``: the output before the value). The matcher is already past
        the sentinel: the structure resumes where it is."""
        return [Configuration(self, matcher, STRUCT, 0, b"", None)]

    def _kept_after(self, text: bytes, read: Callable[[bytes], list[Configuration]]) -> list[Configuration]:
        """The configurations after ``text`` from this schema's start (``read(text)``), read
        once per text and handed out as forks (the steps advance their matchers in place):
        what follows a tool's name or a union's discriminator depends on the value and the
        output before it alone, the same in every request (``[{"name": `` before each
        tool's name). Kept with this schema, so they go when a cache evicts it."""
        with self._kept_lock:
            found = self._kept.get(text)
        if found is None:  # (read outside the lock: a slow read holds up no other text)
            found = read(text)
            with self._kept_lock:
                found = self._kept.setdefault(text, found, _AFTER_BYTES + len(text))
        with self._kept_lock:  # (forks of one matcher, one at a time)
            return [c._replace(matcher=c.matcher.fork(), cache=None if c.cache is None else {}) for c in found]

    def _settle(
        self, matcher: Any, k: int, node: int, value_start: bytes, cache: dict[Any, Any]
    ) -> list[Configuration]:
        """Configurations at trie node ``node``: inside the value, after it, or both."""
        field = self._fields[k]
        found: list[Configuration] = []
        if not field.leaves[node]:
            found.append(Configuration(self, matcher, k, node, value_start, cache))
        if field.accepting[node]:
            found += self._exit(matcher, k, node, value_start)
        return found

    def _feed(self, matcher: Any, data: bytes, before: bytes | bytearray) -> list[Configuration]:
        """Configurations after the bytes ``data`` from a structural configuration
        (every reading: structure alone, or entering a field at each possible start)."""
        found: list[Configuration] = []
        whole = matcher.fork()
        if whole.accept_string(data):
            found.append(Configuration(self, whole, STRUCT, 0, b"", None))
        for j in value_start_offsets(data, self._starts_first):
            for k, field in enumerate(self._fields):
                if data[j] not in field.first:
                    continue
                entered = matcher.fork()
                if not entered.accept_string(data[:j] + field.sentinel):
                    continue
                piece, value_start = data[j:], bytes(before) + data[:j]
                node = field.tails.get(piece)
                if node is not None:
                    found += self._settle(entered, k, node, value_start, {})
                for i in value_end_offsets(piece, field.last):
                    value_node = field.middles.get(piece[:i])
                    if value_node is not None:
                        for config in self._exit(entered, k, value_node, value_start):
                            found += config.schema._feed(config.matcher, piece[i:], value_start + piece[:i])
        return found

    def _enters_field(self, matcher: Any, text: bytes) -> bool:
        """Whether some field may begin inside ``text`` read from the structural ``matcher``
        (not modified): at a place where a value may start, with a byte a field's values
        start with, the structure so far takes the field's sentinel. If not, the structure
        alone reads ``text``. One pass, one fork per such place and field."""
        if not self._fields:
            return False
        probe, fed = matcher.fork(), 0
        for j in value_start_offsets(text, self._starts_first):
            if j > fed and not probe.accept_string(text[fed:j]):
                return False  # (the structure refuses, and no field was entered before)
            fed = j
            if any(text[j] in f.first and probe.fork().accept_string(f.sentinel) for f in self._fields):
                return True
        return False

    def _feasible(self, matcher: Any, data: bytes, before: bytes | bytearray) -> bool:
        """Whether ``data`` can follow a structural configuration (the masks' question:
        :meth:`_feed` without building every reading)."""
        if matcher.accept_string(data):
            matcher.rollback(1)
            return True
        return bool(self._feed(matcher, data, before))

    def _token(
        self, config: Configuration, token: int, data: bytes | None, before: bytes | bytearray
    ) -> list[Configuration]:
        """Configurations after ``token`` from ``config`` (never modifies its matcher)."""
        _, matcher, k, node, value_start, cache = config
        if k == STRUCT:
            if data is None or token not in self._crossing:
                following = matcher.fork()
                return [Configuration(self, following, STRUCT, 0, b"", None)] if following.accept_token(token) else []
            return self._feed(matcher, data, before)
        if data is None:
            return []
        field = self._fields[k]
        found: list[Configuration] = []
        following = field.automaton.next_state(node, token)
        if following != DEAD:
            found += self._settle(matcher, k, following, value_start, cache)
        pieces = field.pieces
        view = field.exit_nodes_view
        e = bisect_left(view, node)
        while e < len(view) and view[e] == node:
            piece = int(field.exit_pieces[e])
            lo, hi = int(pieces.head_offsets[piece]), int(pieces.head_offsets[piece + 1])
            h = bisect_left(pieces.head_tokens_view, token, lo, hi)
            while h < hi and pieces.head_tokens_view[h] == token:
                end = int(pieces.head_ends[h])
                for after in self._exit(matcher, k, int(field.exit_values[e]), value_start):
                    found += after.schema._feed(after.matcher, data[end:], value_start + data[:end])
                h += 1
            e += 1
        return found

    def _fill(
        self,
        config: Configuration,
        row: npt.NDArray[np.int32],
        scratch: npt.NDArray[np.int32],
        before: bytes | bytearray,
    ) -> bool:
        """Overwrite ``row`` with the tokens allowed from ``config`` (``before``: the output
        so far). Returns whether some token may enter a field from here (so the next
        accepted token needs every reading, not xgrammar's alone)."""
        matcher, k, node = config.matcher, config.field, config.node
        support = self._support
        if k == STRUCT:
            if support.inline:
                matcher.fill_next_token_bitmask(row.reshape(1, -1))
                buffer = row
            else:
                matcher.fill_next_token_bitmask(scratch)
                buffer = scratch[0]
                np.copyto(row, buffer[: support.width])
            lo, hi = support.pseudo_words
            words = buffer[lo:hi].tolist()
            entered = False
            if any(words):  # some structural prefix can be followed by a value: which fields?
                if support.inline:
                    buffer[lo:hi] &= support.pseudo_keep
                for w, bits in enumerate(words):
                    bits &= 0xFFFFFFFF
                    while bits:
                        low = bits & -bits
                        prefix_id = 32 * (lo + w) + low.bit_length() - 1 - support.first_pseudo
                        if 0 <= prefix_id < len(support.prefixes):
                            entered |= self._fill_entries(matcher, prefix_id, row, before)
                        bits ^= low
            return entered
        field = self._fields[k]
        field.automaton.fill_bitmask(row.reshape(1, -1), (node,))
        view = field.exit_nodes_view
        e = bisect_left(view, node)
        if e < len(view) and view[e] == node:  # (a value may end here)
            switched = self._switch_exits(config)
            if switched is None:
                self._add_exits(config, row)
            else:
                words, bits = switched
                row[words] |= bits
        return True

    def _add_exits(self, config: Configuration, row: npt.NDArray[np.int32]) -> None:
        """Add to ``row`` the tokens that end the value of ``config``'s field at its node and
        go on in the structure (:meth:`_exit_tokens` of each piece that ends a value there)."""
        _, matcher, k, node, value_start, cache = config
        field = self._fields[k]
        view = field.exit_nodes_view
        e = bisect_left(view, node)
        while e < len(view) and view[e] == node:
            piece, value_node = int(field.exit_pieces[e]), int(field.exit_values[e])
            _set_bits(row, self._exit_tokens(matcher, k, piece, value_node, value_start, cache))
            e += 1

    def _switch_exits(self, config: Configuration) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]] | None:
        """The words of a row and their bits: the tokens that end the value of ``config``'s
        field at its node, a value that switches schemas (a tool's name, a union's
        discriminator), and go on in the schema it chooses; None where the field does not
        switch. They depend on the value and the output before it alone, so they are kept
        per schema for every request (read by the C fill too, which ORs them into the
        trie's row)."""
        k, node, value_start = config.field, config.node, config.value_start
        if not self._switches(k):
            return None
        key = (k, node, bytes(value_start))
        with self._kept_lock:
            found = self._exit_rows.get(key)
        if found is None:
            row = np.zeros(self._support.width, dtype=np.int32)
            self._add_exits(config, row)
            words = np.flatnonzero(row)
            found = (words, row[words])
            with self._kept_lock:
                self._exit_rows.put(key, found, _TOKENS_BYTES + len(key[2]) + words.nbytes + found[1].nbytes)
        return found

    def _exit_tokens(
        self,
        matcher: Any,
        k: int,
        piece: int,
        value_node: int,
        value_start: bytes,
        cache: dict[Any, Any],
    ) -> npt.NDArray[np.int64]:
        """The tokens whose head ``piece`` ends field ``k``'s value (at ``value_node``) and whose
        rest the structure accepts after it."""
        pieces = self._fields[k].pieces
        lo, hi = int(pieces.head_offsets[piece]), int(pieces.head_offsets[piece + 1])
        tokens = pieces.head_tokens[lo:hi]
        # What follows the value: the same for every value, except where the value
        # picks the grammar that follows (a tool's arguments). Computed once per value.
        key = value_node if self._switches(k) else -1
        following = cache.get(key)
        if following is None:
            after_configs = self._exit(matcher, k, value_node, value_start)
            after = None
            if len(after_configs) == 1 and after_configs[0].field == STRUCT:
                after = np.zeros(self._support.xgr_width, dtype=np.int32)
                after_configs[0].matcher.fill_next_token_bitmask(after.reshape(1, -1))
            following = cache[key] = (after_configs, after)
        after_configs, after = following
        if after is not None:
            # one gather for three questions per head: is the rest a token the structure
            # takes; is its longest token prefix refused; may a value start in it again
            ids = pieces.head_lookups[:, lo:hi]
            safe = np.maximum(ids, 0)
            bits = (ids >= 0) & ((after[safe >> 5] >> (safe & 31)) & 1).astype(bool)
            ok, alone, again = bits[0], bits[1] | (ids[1] < 0), bits[2] | (ids[2] == -1)
            found: list[npt.NDArray[np.int64]] = [tokens[ok]]
            probe = ~ok & ((alone & (ids[0] < 0)) | again)
        else:
            found, probe = [], np.ones(hi - lo, dtype=bool)
        for h in (lo + np.flatnonzero(probe)).tolist():
            token, end = int(pieces.head_tokens[h]), int(pieces.head_ends[h])
            data = self._support.tokens[token]
            assert data is not None
            rest = data[end:]
            verdict = cache.get((rest, key))
            if verdict is None:  # configurations are never modified: _feed forks
                verdict = cache[(rest, key)] = any(
                    c.schema._feasible(c.matcher, rest, value_start + data[:end]) for c in after_configs
                )
            if verdict:
                found.append(np.array([token]))
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)

    def _switches(self, k: int) -> bool:
        """Whether leaving field ``k`` moves to another schema (the tool name of compile_tools)."""
        return False

    def _fill_entries(
        self, matcher: Any, prefix_id: int, row: npt.NDArray[np.int32], before: bytes | bytearray
    ) -> bool:
        """Add the tokens that enter a field after structural prefix ``prefix_id``;
        whether any field can be entered there."""
        prefix = self._support.prefixes[prefix_id]
        entered = False
        for k in self._fields_by_prefix.get(prefix_id, ()):
            field = self._fields[k]
            if not matcher.accept_string(prefix + field.sentinel):
                continue
            matcher.rollback(1)
            entered = True
            mask = field.enter_masks.get(prefix_id)
            if mask is not None:
                row[mask[0]] |= mask[1]
            for token, start, end, node in field.middle_by_prefix.get(prefix_id, ()):
                data = self._support.tokens[token]
                assert data is not None
                inside = matcher.fork()
                inside.accept_string(prefix + field.sentinel)
                value_start = bytes(before) + prefix
                after = self._exit(inside, k, node, value_start)
                if any(c.schema._feasible(c.matcher, data[end:], value_start + data[start:end]) for c in after):
                    _set_bits(row, np.array([token]))
        return entered


def _set_bits(row: npt.NDArray[np.int32], tokens: npt.NDArray[np.int64]) -> None:
    np.bitwise_or.at(row.view(np.uint32), tokens >> 5, np.left_shift(np.uint32(1), (tokens & 31).astype(np.uint32)))
