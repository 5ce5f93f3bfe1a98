"""DagAutomaton: the lookup of a trie over a finite language's minimal acyclic automaton."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import numpy.typing as npt

from ..base import (
    ArgumentTypeError,
    AutomatonFileError,
    ByteDag,
    StateError,
    ValueIndexError,
    ValueSetError,
    register_kind,
)
from .checks import STORED_DTYPES, expect_dtype, expect_within, spells_utf8, stored_arguments
from .core import DEAD, AutomatonMeta, state_index
from .forced import ForcedChains
from .trie import TrieAutomaton


class DagLanguage:
    """What an automaton over a finite language's minimal byte DAG answers from the DAG itself,
    whatever its layout (:class:`DagAutomaton`, whose edges are all found when it is compiled,
    and :class:`~triemask.LazyDagAutomaton`, whose edges are found on first use): the pattern,
    the language's strings (counted and indexed by path counts, not enumerated), the text that
    tokens spell, forced continuations and the fingerprint."""

    if not TYPE_CHECKING:  # (empty: the automaton's class holds the fields, which mypy reads as declared below)
        __slots__ = ()
    _DAG_ARRAYS: ClassVar[tuple[str, ...]] = ("in_offsets", "source", "byte", "dest", "accepting", "level_offsets")
    _dag: ByteDag
    _pattern: str | None
    _counts: list[int] | None
    _out_edges: list[list[tuple[int, int]]] | None
    _chains: ForcedChains | None
    _num_nodes: int
    _set_fingerprint: str | None

    if TYPE_CHECKING:  # (the automaton's own, from its layout's class)

        def _node(self, state: int) -> int: ...
        def is_final(self, state: int) -> bool: ...
        def is_accepting(self, state: int) -> bool: ...
        def next_state(self, state: int, token_id: int) -> int: ...

    def _token_text(self, token: int) -> bytes:
        """The bytes of text token ``token`` (one the automaton allows somewhere)."""
        raise NotImplementedError

    def forced_bytes(self, state: int) -> bytes:
        """The bytes every string of the language continuing from ``state`` begins with (see
        :meth:`TrieAutomaton.forced_bytes`): the byte automaton's run of nodes with one edge."""
        node = self._node(state)
        if node == self._num_nodes:
            return b""
        return self._dag_chains().forced(node)

    def _dag_chains(self) -> ForcedChains:
        if self._chains is None:  # (idempotent: either thread's arrays may be kept)
            dag = self._dag
            self._chains = ForcedChains.of_edges(self._num_nodes, dag.source, dag.byte, dag.dest, dag.accepting)
        return self._chains

    def _forced_nodes(self) -> int:
        return self._dag_chains().forced_nodes

    @property
    def set_fingerprint(self) -> str:
        """Fingerprint of the language: of its minimal DAG (canonical for the language)."""
        if self._set_fingerprint is None:
            digest = hashlib.blake2b(b"dag", digest_size=16)
            for name in self._DAG_ARRAYS:
                digest.update(np.ascontiguousarray(getattr(self._dag, name)).tobytes())
            self._set_fingerprint = digest.hexdigest()
        return self._set_fingerprint

    @property
    def pattern(self) -> str | None:
        """The regular expression this automaton was compiled from (None for a set
        compiled with ``layout="dag"``)."""
        return self._pattern

    @property
    def num_values(self) -> int:
        """Number of strings in the language (exact; may exceed any fixed-width integer)."""
        return self._path_counts()[0]

    def _path_counts(self) -> list[int]:
        if self._counts is None:
            self._counts = self._dag.path_counts()
        return self._counts

    def value_of(self, state: int) -> str | bytes | None:
        """Not available: a node of a DAG does not determine its text. Raises
        :class:`~triemask.StateError` pointing to :meth:`spell` and ``Matcher.value``."""
        self._node(state)
        raise StateError(
            f"a {type(self).__name__} state does not determine the text (many strings reach one node): "
            "read it from the tokens with spell(token_ids) or Matcher.value"
        )

    def spell(self, token_ids: Iterable[int]) -> str | None:
        """The string ``token_ids`` spell from the initial state when it is complete
        (a member of the language), else None; an EOS and what follows it are ignored."""
        if not isinstance(token_ids, Iterable) or isinstance(token_ids, str | bytes):
            raise ArgumentTypeError(
                f"token_ids must be an iterable of integers, got {type(token_ids).__name__} {token_ids!r:.40}"
            )
        state = 0
        pieces: list[bytes] = []
        for token in token_ids:
            if self.is_final(state):
                break
            following = self.next_state(state, token)
            if following == DEAD:
                return None
            if following < self._num_nodes:  # a text token (EOS leads to a final state)
                pieces.append(self._token_text(int(token)))
            state = following
        if not self.is_accepting(state):
            return None
        return b"".join(pieces).decode("utf-8")

    def value(self, index: int) -> str:
        """The ``index``-th string of the language in byte order (computed by walking
        the automaton with its path counts, not by enumerating)."""
        if type(index) is not int:
            index = state_index(index, "value indices")
        counts = self._path_counts()
        if not 0 <= index < counts[0]:
            raise ValueIndexError(f"value index {index} is outside [0, {counts[0]})")
        if self._out_edges is None:
            self._out_edges = self._dag.out_edges()
        out = self._out_edges
        accepting = set(self._dag.accepting.tolist())
        node, spelled = 0, bytearray()
        while True:
            if node in accepting:
                if index == 0:
                    return spelled.decode("utf-8")
                index -= 1
            for byte, child in out[node]:
                if index < counts[child]:
                    spelled.append(byte)
                    node = child
                    break
                index -= counts[child]

    def values(self) -> list[str | bytes]:
        """Every string of the language, in byte order (refused above a million)."""
        if self.num_values > 1_000_000:
            raise ValueSetError(
                f"the language of {self._pattern or 'this set'!r:.80} has {self.num_values} strings; "
                "enumerate a range of value(i) instead"
            )
        return [self.value(i) for i in range(self.num_values)]

    def _language_stats(self, base: dict[str, Any]) -> dict[str, Any]:
        """The layout's stats less a trie's figures, plus the language's."""
        for key in ("duplicates_collapsed", "value_bytes", "trie_nodes", "prefix_sharing_ratio"):
            base.pop(key, None)
        base["values"] = self.num_values
        base["pattern"] = self._pattern
        base["dag_nodes"] = self._num_nodes
        base["dag_edges"] = self._dag.num_edges
        base["accepting_nodes"] = len(self._dag.accepting)
        return base


class DagAutomaton(DagLanguage, TrieAutomaton):
    """The compiled form of a finite *language* (a regex, a format, a set) for one vocabulary.

    Create one with :meth:`triemask.Compiler.compile_regex`,
    :meth:`~triemask.Compiler.compile_format` or ``compile(values, layout="dag")``.
    It has the decoding interface of a :class:`TrieAutomaton` (and is one, for every
    adapter and batch API), but its
    nodes are the states of the language's minimal acyclic byte automaton, not of a
    trie: a node may be reached by many strings (``2024-01-`` and ``1999-12-`` end
    at one node of ``date``), so a state does not determine the text. The text is
    read from the tokens instead: :meth:`spell`, or :attr:`triemask.Matcher.value`.

    States: ``0 .. num_nodes - 1`` are nodes (0 is the start), ``num_nodes + j`` is
    the final state reached by EOS from the ``j``-th accepting node, DEAD is -1.
    ``num_values`` is the number of strings in the language (a Python int: a UUID
    has 22**32 spellings), ``value(i)`` the ``i``-th of them in byte order.
    """

    __slots__ = ("_chains", "_counts", "_dag", "_out_edges", "_pattern", "_spell_flat", "_spell_ids", "_spell_offsets")

    def __init__(
        self,
        *,
        dag: Any,
        pattern: str | None,
        spell_ids: npt.NDArray[np.int32],
        spell_offsets: npt.NDArray[np.int64],
        spell_flat: npt.NDArray[np.uint8],
        **arrays: Any,
    ) -> None:
        super().__init__(**arrays)
        self._dag = dag
        self._pattern = pattern
        self._spell_ids = spell_ids
        self._spell_offsets = spell_offsets
        self._spell_flat = spell_flat
        for array in (spell_ids, spell_offsets, spell_flat):
            array.flags.writeable = False
        # computed on first use (value counts and indexing only): idempotent, so thread-safe
        self._counts: list[int] | None = None
        self._out_edges: list[list[tuple[int, int]]] | None = None
        self._chains: ForcedChains | None = None

    _kind: ClassVar[str] = "dag"

    def _file_meta(self) -> dict[str, Any]:
        return {**super()._file_meta(), "pattern": self._pattern}

    def _stored_arrays(self) -> dict[str, npt.NDArray[Any]]:
        arrays = super()._stored_arrays()
        arrays.update(spell_ids=self._spell_ids, spell_offsets=self._spell_offsets, spell_flat=self._spell_flat)
        arrays.update({f"dag_{name}": getattr(self._dag, name) for name in self._DAG_ARRAYS})
        return arrays

    @classmethod
    def _check_stored(cls, meta: dict[str, Any], arrays: dict[str, Any], vocab: Any = None) -> None:
        super()._check_stored(meta, arrays, vocab)
        for name in ("spell_ids", "spell_offsets", "spell_flat", *(f"dag_{name}" for name in cls._DAG_ARRAYS)):
            expect_dtype(arrays, name, STORED_DTYPES[name])
        spell_ids, spell_offsets = arrays["spell_ids"], arrays["spell_offsets"]
        expect_within(spell_ids, 0, meta["vocab_size"], "spell_ids")
        if (np.diff(spell_ids) <= 0).any() or len(spell_offsets) != len(spell_ids) + 1:
            raise AutomatonFileError("spelled tokens not ascending, or not one offset each", field="spell_ids")
        if int(spell_offsets[0]) != 0 or (np.diff(spell_offsets) < 0).any():
            raise AutomatonFileError("spelling offsets out of order", field="spell_offsets")
        if int(spell_offsets[-1]) != len(arrays["spell_flat"]):
            raise AutomatonFileError("spelling offsets past the spelled bytes", field="spell_offsets")
        # the byte DAG, which value(), values() and num_values walk: in bounds and acyclic
        num_nodes = len(arrays["edge_offsets"]) - 2
        source, dest, levels = arrays["dag_source"], arrays["dag_dest"], arrays["dag_level_offsets"]
        if len(source) != len(dest) or len(arrays["dag_byte"]) != len(source):
            raise AutomatonFileError("byte edges of unequal lengths", field="dag_source")
        expect_within(source, 0, num_nodes, "dag_source")
        expect_within(dest, 0, num_nodes, "dag_dest")
        expect_within(arrays["dag_accepting"], 0, num_nodes, "dag_accepting")
        if not np.array_equal(arrays["dag_accepting"], arrays["terminal_nodes"]):
            raise AutomatonFileError("accepting nodes that are not the terminal nodes", field="dag_accepting")
        in_offsets = arrays["dag_in_offsets"]
        if (
            len(in_offsets) != num_nodes + 1
            or int(in_offsets[0]) != 0
            or (np.diff(in_offsets) < 0).any()
            or int(in_offsets[-1]) != len(dest)
            or (np.diff(dest.astype(np.int64)) < 0).any()
        ):
            raise AutomatonFileError("byte edges not grouped by destination", field="dag_in_offsets")
        if not np.array_equal(levels, arrays["level_offsets"]):
            raise AutomatonFileError("byte levels that are not the automaton's", field="dag_level_offsets")
        level = np.searchsorted(levels, np.arange(num_nodes), side="right") - 1
        if (level[dest] <= level[source]).any():
            raise AutomatonFileError("a byte edge that does not lead one level down (a cycle)", field="dag_dest")
        if not spells_utf8(source, arrays["dag_byte"], dest, levels, arrays["dag_accepting"]):  # a DAG spells str
            raise AutomatonFileError("byte edges that spell strings which are not UTF-8", field="dag_byte")

    @classmethod
    def _check_edges(cls, arrays: dict[str, Any], vocab: Any) -> None:
        """(A DAG's token edges are checked to lead down its levels in :meth:`_check_stored`.)"""

    @classmethod
    def _from_stored(cls, meta: dict[str, Any], arrays: dict[str, Any], vocab: Any = None) -> DagAutomaton:

        cls._check_stored(meta, arrays, vocab)
        dag = ByteDag(**{name: arrays[f"dag_{name}"] for name in cls._DAG_ARRAYS})
        return cls(
            dag=dag,
            pattern=meta["pattern"],
            spell_ids=arrays["spell_ids"],
            spell_offsets=arrays["spell_offsets"],
            spell_flat=arrays["spell_flat"],
            **stored_arguments(cls, arrays),
            meta=AutomatonMeta.from_file(meta),
        )

    def _arrays(self) -> list[npt.NDArray[Any]]:
        if not hasattr(self, "_dag"):  # called by the base constructor, before these are set
            return super()._arrays()
        dag = self._dag
        return [
            *super()._arrays(),
            self._spell_ids,
            self._spell_offsets,
            self._spell_flat,
            dag.in_offsets,
            dag.source,
            dag.byte,
            dag.dest,
            dag.accepting,
        ]

    def _token_text(self, token: int) -> bytes:
        i = int(np.searchsorted(self._spell_ids, token))
        return self._spell_flat[self._spell_offsets[i] : self._spell_offsets[i + 1]].tobytes()

    def is_accepting(self, state: int) -> bool:
        """Whether the tokens so far spell a complete string of the language (true in
        final states too)."""
        node = self._node(state)
        if node == self._num_nodes:
            return state != DEAD
        i = int(np.searchsorted(self._terminal_nodes, np.int32(node)))  # an int32 key: no cast of the array
        return i < len(self._terminal_nodes) and int(self._terminal_nodes[i]) == node

    def stats(self) -> dict[str, Any]:
        """Structure of the automaton: nodes, edges and allowed tokens by level (the
        longest distance from the start, in bytes)."""
        return self._language_stats(super().stats())

    def __repr__(self) -> str:
        return (
            f"DagAutomaton(pattern={self._pattern!r:.60}, nodes={self._num_nodes}, "
            f"edges={int(self._edge_offsets[-1])}, eos={self._meta.eos}, memory_bytes={self.memory_bytes})"
        )


register_kind("dag", DagAutomaton)
