"""LazyDagAutomaton: a finite pattern's minimal byte DAG in the lazy layout.

``compile_regex(pattern, layout="lazy")`` (and ``compile_format``) keeps the DAG, not its
edges: a node's out-edges, in byte order, take the places a trie node's children take in the
lazy set layout (:mod:`triemask.automata.lazy`), "slots" numbered from 1, with ``node_byte``
their bytes and ``slot_dest`` the node each leads to. The lazy layout's walk of a node's
subtrie against the vocabulary's token trie then walks the DAG from that node (the token
trie bounds it), so a node's edges are found on first use, cached, and the same as the eager
:class:`~triemask.DagAutomaton`'s: the same states, masks and steps. Compiling costs the DAG
(microseconds to a fraction of a millisecond), the first mask one node's walk: for languages
that allow much of the vocabulary at many positions (semver, IPv6: hundreds of thousands of
edges in all, tens or hundreds at the start) the first mask comes far sooner.

The C kernel keeps, for a DAG of under 255 nodes, each node's destination by byte in one table
and its *runs*: with the bytes in 54 groups (each ASCII digit and punctuation character, letters
in four ranges a case, ...), the node that every byte of a group leads to at each step. The vocabulary's
token trie keeps the groups of the bytes below each of its nodes, so a token-trie subtree whose
bytes all lead down a run (the letters and digits below ``"get"`` in an identifier) is matched
whole, each token to the run's node at its length, without a lookup per byte (or scanned, a
byte outside a wide run's groups ending the match where no other byte leads on): an
identifier's first row, 33,000 tokens of Qwen2.5's 151,000, in 0.17 ms. A node allowing half the vocabulary
or more keeps its row alone (a step reads the token's bytes down the DAG), a twentieth of its
tokens and destinations listed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..base import ArgumentTypeError, ByteDag
from .dag import DagLanguage
from .forced import ForcedChains
from .lazy import LazyTrieAutomaton

# What the C kernel keeps a node (lazy_kernels.c): its out-bytes as bits (32) and their slots
# by word (16); in a DAG of under 255 nodes, its destinations by byte (256) and its runs (49
# steps of a group mask, a node and the node where tokens may end: 539; its own step's groups
# and how far its run stays closed: 9)
_KERNEL_BYTES_PER_NODE = 48
_SMALL_DAG_NODES, _SMALL_DAG_BYTES_PER_NODE = 255, 256 + 49 * (8 + 1 + 2) + 9


class LazyDagAutomaton(DagLanguage, LazyTrieAutomaton):
    """A finite language's minimal byte automaton whose edges are found on first use and cached
    (``compile_regex(pattern, layout="lazy")``, ``compile_format(name, layout="lazy")``).

    The states, masks and methods of :class:`~triemask.DagAutomaton` (nodes ``0 ..
    num_nodes - 1``, the final state ``num_nodes + j`` after EOS at the ``j``-th accepting
    node; the text read from the tokens: :meth:`spell`, ``Matcher.value``), the cache of
    :class:`~triemask.LazyTrieAutomaton` (``cache_info``, ``cache_clear``, ``stats()["cache"]``).
    Not saved or pickled: compile the pattern again (it takes well under a millisecond), or
    save the eager layout.
    """

    __slots__ = ("_chains", "_counts", "_dag", "_out_edges", "_pattern", "_slot_dest", "_token_bytes")

    def __init__(
        self,
        *,
        dag: ByteDag,
        pattern: str | None,
        slot_dest: npt.NDArray[np.int32],
        token_bytes: tuple[npt.NDArray[Any], npt.NDArray[Any], bytes],
        **arrays: Any,
    ) -> None:
        # (set first: the base constructor reads the slots for its kernel and its arrays)
        self._dag, self._pattern, self._slot_dest, self._token_bytes = dag, pattern, slot_dest, token_bytes
        self._counts: list[int] | None = None
        self._out_edges: list[list[tuple[int, int]]] | None = None
        self._chains: ForcedChains | None = None
        super().__init__(**arrays)

    def _slot_nodes(self, slots: Any) -> Any:
        return self._slot_dest[slots]

    def _native_slots(self) -> npt.NDArray[np.int32] | None:
        return self._slot_dest

    def _arrays(self) -> list[npt.NDArray[Any]]:
        dag = self._dag
        return [*super()._arrays(), self._slot_dest, dag.in_offsets, dag.source, dag.byte, dag.dest, dag.accepting]

    @property
    def memory_bytes(self) -> int:
        """Bytes held by the automaton's arrays, the kernel's lookups of a node's children by
        byte (48 a node; 852 in a DAG of under 255 nodes) and, now, the cache (the shared token
        trie excluded)."""
        return super().memory_bytes + (self.kernel_bytes(self._num_nodes) if self._kernel is not None else 0)

    @staticmethod
    def kernel_bytes(num_nodes: int) -> int:
        """What the C kernel adds for a DAG of ``num_nodes`` nodes (its lookups of a child by
        byte and its runs): priced by the compiler before the kernel is built."""
        small = _SMALL_DAG_BYTES_PER_NODE if num_nodes < _SMALL_DAG_NODES else 0
        return (_KERNEL_BYTES_PER_NODE + small) * num_nodes

    def _token_text(self, token: int) -> bytes:
        lengths, offsets, data = self._token_bytes
        start = int(offsets[token])
        return bytes(data[start : start + int(lengths[token])])

    def file_parts(self) -> tuple[str, dict[str, Any], dict[str, npt.NDArray[Any]]]:
        """Not available: a lazy pattern automaton is not saved (raises ArgumentTypeError)."""
        raise ArgumentTypeError(
            "a LazyDagAutomaton is not saved or pickled: compile the pattern again (well under a "
            "millisecond), or compile it with layout='dag' to save it"
        )

    def stats(self) -> dict[str, Any]:
        """Structure of the automaton and its cache: the DAG's nodes and edges, the language's
        size, ``cache`` (:meth:`cache_info`), and how the kernel finds a node's child by byte
        (``child_lookup``: a table by byte and the runs for a DAG of under 255 nodes, else bits
        and their ranks; NumPy without the C extension)."""
        base = self._language_stats(super().stats())
        base["forced_nodes"] = self._forced_nodes()
        kernel_lookup = "table and runs" if self._num_nodes < _SMALL_DAG_NODES else "bits and ranks"
        base["child_lookup"] = "numpy" if self._kernel is None else kernel_lookup
        return base

    def __repr__(self) -> str:
        info = self.cache_info()
        return (
            f"LazyDagAutomaton(pattern={self._pattern!r:.60}, nodes={self._num_nodes}, eos={self._meta.eos}, "
            f"memory_bytes={self.memory_bytes}, cached_nodes={info['entries']}, cache_bytes={info['limit']})"
        )
