"""Compiling a set of values into a :class:`TrieAutomaton`, with array operations only.

For every trie node ``a`` the automaton needs the tokens ``t`` such that
``prefix(a) + bytes(t)`` is again a prefix of some value, and the node that
string ends at. Equivalently: for every node ``m`` and every ancestor ``a`` of
``m``, whether the bytes on the path ``a -> m`` form a token. The compiler
answers that for all nodes at once, one level at a time: a frontier of pairs
``(a, m)`` whose path is a suffix of some token (a node ``u`` of the token
index's reversed-token trie), starting with every edge ``parent(m) -> m``; each
step moves every ``a`` one node up and follows one byte in the reversed-token
trie, dropping the pairs that no token ends with. A pair whose ``u`` carries a
token id is an allowed edge ``a --token--> m``. The work is proportional to the
number of (node, token-suffix) pairs, about trie nodes x average token length,
and independent of the vocabulary size.

Each edge is packed into one uint64, ``source | token | destination``, so one
sort lays the edges out by node with token ids ascending. The automaton stores no
bitmask words: a row is set from its node's tokens when it is filled.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..automata import (
    AutomatonMeta,
    DagAutomaton,
    LazyDagAutomaton,
    LazyTrieAutomaton,
    TrieAutomaton,
)
from ..base import (
    ArgumentTypeError,
    ByteDag,
    ByteTrie,
    IncompatibleValueError,
    ValueSetError,
    build_trie,
    cache_directory,
    dag_of_trie,
    encode_values,
    kernels,
    set_fingerprint,
)
from ..vocab import TokenIndex, Vocabulary
from .budget import EdgeBudget, checked_budget, checked_cache_bytes, over_budget
from .lazy import lazy_arrays, lazy_dag_arrays
from .matching import (
    EdgeKeys,
    eos_edges,
    match_dag,
    match_dag_by_class,
    match_trie,
    prune_unreachable,
    raise_incompatible,
)
from .regex import FORMATS, dag_of_pattern
from .update import updated

EdgeTable = tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]]
"""A CSR of edges by node: ``(tokens, dests, offsets)``."""

_NO_EOS = np.zeros(0, dtype=np.int64)


def _trie_piece_edges(trie: ByteTrie, pieces: TokenIndex) -> EdgeTable:
    """The edges of a second token table (a mixed schema's token pieces) on ``trie``, no EOS:
    the C matching where the extension is built (a sixth of the reference's time at 3,000
    values), else ``match_trie``, which the tests compare it with."""
    n = trie.num_nodes
    native = kernels.KERNELS
    if native is None:
        keys = EdgeKeys(n, n, pieces.vocab.vocab_size)
        return keys.csr(match_trie(trie, pieces, keys), n)
    csr = native.match_trie(pieces.native_tables(), trie.parent, trie.byte, trie.terminal, _NO_EOS, -1)
    assert csr is not None  # (None only past a budget: there is none)
    offsets, tokens, dests = (np.frombuffer(b, dtype=np.int32) for b in csr)
    return tokens, dests, offsets


def _dag_piece_edges(dag: ByteDag, pieces: TokenIndex) -> EdgeTable:
    """:func:`_trie_piece_edges` on an acyclic automaton (``match_dag``)."""
    n = dag.num_nodes
    native = kernels.KERNELS
    if native is None:
        keys = EdgeKeys(n, n, pieces.vocab.vocab_size)
        return keys.csr(match_dag(dag, pieces, keys), n)
    csr = native.match_dag(
        pieces.native_tables(),
        dag.in_offsets,
        dag.source,
        dag.byte,
        dag.accepting,
        _NO_EOS,
        pieces.vocab.vocab_size,
        -1,
        -1,
        0,
    )
    assert not isinstance(csr, str)  # (a str only past a budget: there is none)
    offsets, tokens, dests, _ = (np.frombuffer(b, dtype=np.int32) for b in csr)
    return tokens, dests, offsets


def _single_byte_tokens(vocab: Vocabulary) -> npt.NDArray[np.int64]:
    """For each byte value, the smallest id of a token that is exactly that byte (-1: none),
    read-only."""
    found = np.full(256, -1, dtype=np.int64)
    lengths, offsets, data = vocab.byte_table()
    order = np.flatnonzero(lengths == 1)[::-1]  # the smallest id written last
    found[np.frombuffer(data, dtype=np.uint8)[offsets[order]]] = order
    found.setflags(write=False)
    return found


class SetCompiler:
    """Compiles sets of values, patterns and formats against one vocabulary: the set half of
    :class:`triemask.Compiler` (which adds JSON schemas and tool lists; its docstring has the
    parameters). The schema layer uses this half directly."""

    __slots__ = ("__weakref__", "_byte_tokens", "_index", "_index_source", "_vocab")

    def __init__(
        self, vocab: Vocabulary, *, disk_cache: bool = True, cache_dir: str | os.PathLike[str] | None = None
    ) -> None:
        if not isinstance(vocab, Vocabulary):
            raise ArgumentTypeError(f"Compiler needs a triemask.Vocabulary, got {type(vocab).__qualname__}")
        self._vocab = vocab
        self._byte_tokens = _single_byte_tokens(vocab)  # (with the index: an update's first call reads it)
        directory = (Path(cache_dir) if cache_dir is not None else cache_directory()) if disk_cache else None
        self._index, self._index_source = TokenIndex.cached(vocab, directory)

    @property
    def vocab(self) -> Vocabulary:
        """The vocabulary this compiler indexes."""
        return self._vocab

    def single_byte_tokens(self) -> npt.NDArray[np.int64]:
        """For each byte value, the smallest id of a token that is exactly that byte (-1: none);
        read-only, found once per compiler (a scan of the vocabulary each update would repeat)."""
        return self._byte_tokens

    def stats(self) -> dict[str, Any]:
        """Sizes and build (or load) time of the per-vocabulary token index, and ``source``:
        whether it was loaded from the disk cache, built (and written there), or why not."""
        return {**self._index.stats(), "source": self._index_source}

    def compile(
        self,
        values: Iterable[str] | Iterable[bytes],
        *,
        eos: bool = True,
        layout: str = "trie",
        max_bytes: int | None = None,
        cache_bytes: int | None = None,
    ) -> TrieAutomaton:
        """Compile the set ``values`` into an automaton.

        Parameters
        ----------
        values : iterable of str or of bytes
            The allowed strings: all ``str`` (UTF-8) or all ``bytes``. Duplicates
            collapse; the empty string is a legal value; the set must not be empty.
        eos : bool
            When True, a complete value allows the vocabulary's EOS tokens, which
            lead to a final state. When False, masks never contain EOS (for use
            inside a larger grammar); ``is_accepting`` / ``value_of`` tell when a
            value is complete.
        layout : {"trie", "dag", "lazy"}
            ``"trie"`` (default): one node per distinct prefix, so a state names its
            value (``value_of``). ``"dag"``: the set's minimal acyclic automaton, shared
            suffixes merged too (a :class:`DagAutomaton`): the same masks and step, 10-25x
            less memory on sets with common endings (codes, names; a faster compile from
            about 100,000 values), but a state no longer determines the value: read it
            with ``Matcher.value`` or ``spell(token_ids)``. Measured in docs/formats.md.
            ``"lazy"``: the trie's states and masks, but only the trie is stored and each
            node's edges are found on first use and cached (a :class:`LazyTrieAutomaton`):
            6-9x less memory on large sets and a faster compile, for a first step at a node
            that costs a walk of its subtrie. Measured in docs/large-sets.md.
        max_bytes : int, optional
            The most memory the automaton may take (``memory_bytes``). Checked on the
            values, on the trie and during token matching, before the large
            allocations, so a set too large for the budget fails fast and small
            (compilation itself needs about 2.5x the automaton at its peak). With
            ``layout="dag"`` only the result is checked (the minimal DAG is small); with
            ``layout="lazy"``, the trie arrays plus ``cache_bytes``.
        cache_bytes : int, optional
            ``layout="lazy"`` only: the bound of the edge cache in bytes (default
            :data:`DEFAULT_CACHE_BYTES`, 8 MiB); 0 caches nothing.

        Raises
        ------
        ValueSetError
            The set is empty, mixes ``str`` and ``bytes``, holds something else,
            or holds a string that is not valid Unicode.
        IncompatibleValueError
            No sequence of the vocabulary's text tokens spells some value.
        MemoryLimitError
            The automaton would take more than ``max_bytes``.
        """
        max_bytes = checked_budget(max_bytes)
        limit = checked_cache_bytes(cache_bytes, layout)
        if layout == "dag":
            automaton: TrieAutomaton = self._compile_set_dag(values, eos=eos)
        elif layout == "lazy":
            lazy = self._compile_lazy(values, eos=eos, cache_bytes=limit, max_bytes=max_bytes)
            if max_bytes is not None and lazy.memory_bytes + limit > max_bytes:
                raise over_budget(max_bytes, lazy.memory_bytes + limit, "the trie and the cache bound")
            return lazy
        elif layout != "trie":
            raise ValueSetError(f"layout must be 'trie', 'dag' or 'lazy', got {layout!r:.40}")
        else:
            automaton = self._compile(values, eos=eos, max_bytes=max_bytes)[0]
        if max_bytes is not None and automaton.memory_bytes > max_bytes:
            raise over_budget(max_bytes, automaton.memory_bytes, "the automaton")
        return automaton

    def compile_regex(
        self,
        pattern: str,
        *,
        eos: bool = True,
        max_bytes: int | None = None,
        layout: str = "dag",
        cache_bytes: int | None = None,
    ) -> DagAutomaton | LazyDagAutomaton:
        """Compile a regular expression whose language is finite.

        The pattern is anchored (the whole output matches it) and may use literals,
        escapes (``\\d``, ``\\w``, ``\\s``, ``\\xhh``, ``\\uhhhh``), ``.``, character classes
        (non-ASCII ranges included), groups, alternation and bounded repetition
        (``?``, ``{n}``, ``{m,n}``), with xgrammar's meaning of each. The minimal
        acyclic byte automaton of the language is built and matched against the
        vocabulary like a set's trie, so a step is the same lookup.

        Parameters
        ----------
        pattern : str
            The regular expression.
        eos : bool
            As in :meth:`compile`: EOS is allowed once the output is in the language.
        max_bytes : int, optional
            Refuse, before the large allocations, an automaton that would take more memory
            (a few characters can ask for gigabytes: ``.{0,1000}`` allows nearly every token at
            each of its thousands of nodes); checked while the vocabulary is matched, so the
            work done is bounded by it too. With ``layout="lazy"``: the DAG and the cache bound.
        layout : {"dag", "lazy"}
            ``"dag"`` (default): every state's edges found now (:class:`DagAutomaton`: can be
            saved, uploaded to a device). ``"lazy"``: the same states and masks, each state's
            edges found on first use and cached (:class:`LazyDagAutomaton`): compiling costs
            the automaton alone, so a language that allows much of the vocabulary at many
            positions (semver, IPv6, identifiers) has its first mask far sooner.
        cache_bytes : int, optional
            ``layout="lazy"`` only: the bound of the edge cache in bytes (default
            :data:`DEFAULT_CACHE_BYTES`, 8 MiB; a state allowing half the vocabulary or more
            keeps its row alone, a bit a token: an identifier's 33 such states take 0.8 MiB on
            a 200,000-token vocabulary).

        Raises
        ------
        MemoryLimitError
            The automaton would take more than ``max_bytes``.
        UnboundedPatternError
            The pattern repeats without bound (``*``, ``+``, ``{n,}``): its language
            is infinite and needs the structural engine (xgrammar).
        PatternError
            A malformed or unsupported pattern (lookaround, backreferences), one that
            matches nothing, or one whose automaton exceeds the size limits;
            ``.position`` is the offending character offset.
        IncompatibleValueError
            No string of the language can be spelled with the vocabulary's text tokens.
        """
        if not isinstance(pattern, str):
            raise ArgumentTypeError(f"pattern must be a str, got {type(pattern).__name__} {pattern!r:.40}")
        build = self._pattern_layout(layout)
        max_bytes, limit = checked_budget(max_bytes), checked_cache_bytes(cache_bytes, layout)
        return build(dag_of_pattern(pattern), pattern, eos=eos, max_bytes=max_bytes, cache_bytes=limit)

    def compile_format(
        self, name: str, *, eos: bool = True, layout: str = "dag", cache_bytes: int | None = None
    ) -> DagAutomaton | LazyDagAutomaton:
        """Compile one of the built-in finite formats: ``date`` (``YYYY-MM-DD``),
        ``time`` and ``date-time`` (RFC 3339, at most 9 fraction digits), ``uuid``,
        ``ipv4``, ``ipv6``. The patterns are in ``triemask.FORMATS``; ``layout`` and
        ``cache_bytes`` as in :meth:`compile_regex`.

        Raises
        ------
        ValueSetError
            ``name`` is not a built-in format (the message lists them).
        """
        pattern = FORMATS.get(name) if isinstance(name, str) else None
        if pattern is None:
            raise ValueSetError(f"unknown format {name!r:.60}: the built-in formats are {', '.join(FORMATS)}")
        build = self._pattern_layout(layout)
        limit = checked_cache_bytes(cache_bytes, layout)
        return build(dag_of_pattern(pattern), pattern, eos=eos, max_bytes=None, cache_bytes=limit)

    def _pattern_layout(self, layout: str) -> Callable[..., DagAutomaton | LazyDagAutomaton]:
        """The compile of a pattern's DAG in ``layout`` (checked before the DAG is built)."""
        builders: dict[str, Callable[..., DagAutomaton | LazyDagAutomaton]] = {
            "dag": lambda dag, pattern, cache_bytes, **options: self._compile_dag(dag, pattern, **options)[0],
            "lazy": self._compile_lazy_dag,
        }
        if not isinstance(layout, str) or layout not in builders:
            raise ValueSetError(f"a pattern's layout must be 'dag' or 'lazy', got {layout!r:.40}")
        return builders[layout]

    # ------------------------------------------------------------------ for mixed schemas

    def compile_matching(self, values: list[bytes], tokens: TokenIndex) -> tuple[TrieAutomaton, EdgeTable]:
        """Compile ``values`` (``eos=False``) and match a second token table against the
        same trie, by the same linear pass: the CSR ``(tokens, dests, offsets)`` of its
        edges, by node id. Mixed schemas match pieces of tokens (the part before a value's
        end, the part after a value's start) this way."""
        automaton, edges = self._compile(values, eos=False, pseudo=tokens)
        assert edges is not None
        return automaton, edges

    def compile_pattern_matching(self, pattern: str, tokens: TokenIndex) -> tuple[DagAutomaton, EdgeTable]:
        """:meth:`compile_matching` for a finite pattern (a string field's language, quotes
        included)."""
        automaton, edges = self._compile_dag(dag_of_pattern(pattern), pattern, eos=False, pseudo=tokens)
        assert edges is not None
        return automaton, edges

    def with_values(
        self, automaton: TrieAutomaton, added: Iterable[Any] = (), removed: Iterable[Any] = ()
    ) -> TrieAutomaton:
        """``automaton``'s set plus ``added`` minus ``removed``, at a cost proportional to the
        change (:meth:`TrieAutomaton.with_values` delegates here; see :mod:`triemask.sets.update`)."""
        return updated(automaton, added, removed, self)

    def _check_eos(self, eos: bool) -> None:
        if eos and not self._vocab.eos_token_ids:
            raise ValueSetError(
                "compile(eos=True) needs EOS token ids, and this vocabulary has none: "
                "build the Vocabulary with eos_token_ids=..., or compile with eos=False"
            )

    def _compile(
        self,
        values: Iterable[str] | Iterable[bytes],
        *,
        eos: bool,
        pseudo: TokenIndex | None = None,
        max_bytes: int | None = None,
    ) -> tuple[TrieAutomaton, tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]] | None]:
        started = time.perf_counter()
        self._check_eos(eos)
        items, strings, flat, starts, are_str = encode_values(values)
        if max_bytes is not None and flat.nbytes + starts.nbytes > max_bytes:  # the values alone
            raise over_budget(max_bytes, flat.nbytes + starts.nbytes, "the values")
        trie = build_trie(flat, starts, strings=strings)
        n, k = trie.num_nodes, trie.num_strings
        eos_ids = self._vocab.eos_token_ids if eos else ()
        # what the automaton takes besides its edges (8 bytes each): offsets, values, maps
        fixed = 4 * (n + 2) + trie.flat.nbytes + trie.starts.nbytes + 8 * k + trie.level_offsets.nbytes
        if max_bytes is not None and fixed > max_bytes:
            raise over_budget(max_bytes, fixed, f"the trie ({n:,} nodes)")
        max_edges = -1 if max_bytes is None else (max_bytes - fixed) // 8
        native = kernels.KERNELS
        if native is not None:  # the same matching and layout in C (see match_trie)
            if n + k >= 1 << 31:
                raise ValueSetError(f"{n + k} states exceed triemask's 32-bit state ids; split the set")
            try:
                csr = native.match_trie(
                    self._index.native_tables(),
                    trie.parent,
                    trie.byte,
                    trie.terminal,
                    np.asarray(eos_ids, dtype=np.int64),
                    max_edges,
                )
            except OverflowError as error:  # over 2**31 edges
                raise ValueSetError(f"{error}") from None
            if csr is None:  # stopped when the edges passed the budget
                raise over_budget(max_bytes or 0, fixed + 8 * (max_edges + 1), f"the edges of {n:,} nodes")
            offsets, tokens, dests = (np.frombuffer(b, dtype=np.int32) for b in csr)
        else:
            keys = EdgeKeys(n, n + k, self._vocab.vocab_size)
            found = match_trie(trie, self._index, keys)
            if eos:
                found.append(eos_edges(trie.terminal, trie.num_nodes, keys, eos_ids))
            edges = sum(len(batch) for batch in found)
            if max_bytes is not None and edges > max_edges:
                raise over_budget(max_bytes, fixed + 8 * edges, f"the edges of {n:,} nodes")
            tokens, dests, offsets = keys.csr(found, n)
        if not self._every_byte_is_a_token(trie.byte[1:]):
            tokens, dests, offsets, reachable = prune_unreachable(
                n, trie.level_offsets, trie.terminal, tokens, dests, offsets
            )
            spelled = reachable[trie.terminal]
            if not spelled.all():
                raise_incompatible(trie, self._index, reachable, int(np.flatnonzero(~spelled)[0]), are_str)
        terminal_order = np.argsort(trie.terminal, kind="stable").astype(np.int32)
        pseudo_edges = None if pseudo is None else _trie_piece_edges(trie, pseudo)
        automaton = TrieAutomaton(
            edge_offsets=offsets,
            edge_tokens=tokens,
            edge_dests=dests,
            terminal_nodes=trie.terminal[terminal_order],
            terminal_values=terminal_order,
            value_flat=trie.flat,
            value_starts=trie.starts,
            level_offsets=trie.level_offsets,
            meta=self._meta(eos, values_are_str=are_str, input_values=len(items), started=started),
            compiler=self,
        )
        return automaton, pseudo_edges

    def _meta(self, eos: bool, *, values_are_str: bool, input_values: int, started: float) -> AutomatonMeta:
        """The metadata of an automaton compiled by this compiler (``started``: when its compile began)."""
        return AutomatonMeta(
            vocab_size=self._vocab.vocab_size,
            vocab_fingerprint=self._vocab.fingerprint,
            eos_token_ids=self._vocab.eos_token_ids,
            eos=eos,
            values_are_str=values_are_str,
            input_values=input_values,
            compile_seconds=time.perf_counter() - started,
        )

    def _compile_lazy(
        self, values: Iterable[str] | Iterable[bytes], *, eos: bool, cache_bytes: int, max_bytes: int | None
    ) -> LazyTrieAutomaton:
        started = time.perf_counter()
        self._check_eos(eos)
        items, strings, flat, starts, are_str = encode_values(values)
        trie = build_trie(flat, starts, strings=strings)
        n, k = trie.num_nodes, trie.num_strings
        needed = 3 * n + 8 * k + cache_bytes  # node words and bytes, value maps, the cache bound
        if max_bytes is not None and needed > max_bytes:
            raise over_budget(max_bytes, needed, f"the trie ({n:,} nodes) and the cache bound")
        if n + k >= 1 << 31:
            raise ValueSetError(f"{n + k} states exceed triemask's 32-bit state ids; split the set")
        live = None
        if not self._every_byte_is_a_token(trie.byte[1:]):
            # Rare (a vocabulary lacking single-byte tokens): which nodes a token sequence can
            # complete a value from needs every edge once, so the eager layout is built here
            # (and raises IncompatibleValueError for values no tokens spell) and then dropped.
            eager = self._compile(items, eos=eos)[0]
            rows, _ = eager.allowed_token_pairs(np.arange(n))
            live = np.bincount(rows, minlength=n) > 0
            live[trie.terminal] = True
        return LazyTrieAutomaton(
            **lazy_arrays(trie, live),
            token_trie=self._index.token_trie(),
            cache_bytes=cache_bytes,
            set_fingerprint=set_fingerprint(trie.flat, trie.starts, are_str),
            level_offsets=trie.level_offsets,
            meta=self._meta(eos, values_are_str=are_str, input_values=len(items), started=started),
            compiler=self,
        )

    def _compile_lazy_dag(
        self, dag: ByteDag, pattern: str | None, *, eos: bool, max_bytes: int | None, cache_bytes: int
    ) -> LazyDagAutomaton:
        started = time.perf_counter()
        self._check_eos(eos)
        n, accepting = dag.num_nodes, dag.accepting
        # the arrays, the kernel's tables, the cache bound
        needed = 3 * n + 6 * dag.num_edges + 4 * len(accepting) + LazyDagAutomaton.kernel_bytes(n) + cache_bytes
        if max_bytes is not None and needed > max_bytes:
            raise over_budget(max_bytes, needed, f"the automaton ({n:,} nodes) and the cache bound")
        if n + len(accepting) >= 1 << 31:
            raise ValueSetError(f"{n + len(accepting)} states exceed triemask's 32-bit state ids")
        live = None
        if not self._every_byte_is_a_token(dag.byte):
            # as for a lazy set (_compile_lazy): the nodes a token sequence can complete a string
            # from need every edge once, so the eager automaton is built here (it raises
            # IncompatibleValueError where no string can be spelled) and then dropped
            eager = self._compile_dag(dag, pattern, eos=eos, max_bytes=max_bytes)[0]
            rows, _ = eager.allowed_token_pairs(np.arange(n))
            live = np.bincount(rows, minlength=n) > 0
            live[accepting] = True
        arrays = lazy_dag_arrays(dag, live)
        return LazyDagAutomaton(
            dag=dag,
            pattern=pattern,
            slot_dest=arrays.pop("slot_dest"),
            token_bytes=self._vocab.byte_table(),
            **arrays,
            token_trie=self._index.token_trie(),
            cache_bytes=cache_bytes,
            set_fingerprint=None,
            level_offsets=dag.level_offsets,
            meta=self._meta(eos, values_are_str=True, input_values=len(accepting), started=started),
            compiler=self,
        )

    def _compile_set_dag(self, values: Iterable[str] | Iterable[bytes], *, eos: bool) -> DagAutomaton:
        started = time.perf_counter()
        items, strings, flat, starts, are_str = encode_values(values)
        if not are_str:
            raise ValueSetError("layout='dag' spells values as text: give str values (bytes need layout='trie')")
        trie = build_trie(flat, starts, strings=strings)
        if not self._every_byte_is_a_token(trie.byte[1:]):
            self._compile(items, eos=eos)  # names the first value no token sequence spells, if any
        return self._compile_dag(dag_of_trie(trie), None, eos=eos, started=started)[0]

    def _every_byte_is_a_token(self, edge_bytes: npt.NDArray[np.uint8]) -> bool:
        """True when each byte on an edge is itself a token: then every node is
        reachable byte by byte and can complete its values, so nothing needs pruning."""
        used = np.bincount(edge_bytes, minlength=256) > 0
        return not bool((used & ~self._index.byte_is_token).any())

    def _compile_dag(
        self,
        dag: ByteDag,
        pattern: str | None,
        *,
        eos: bool,
        pseudo: TokenIndex | None = None,
        started: float | None = None,
        max_bytes: int | None = None,
    ) -> tuple[DagAutomaton, tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]] | None]:
        """Match the vocabulary against an acyclic byte automaton: the trie compile
        with several parents per node (see ``match_dag``). ``started``: when the
        caller's part of the compile began (for ``compile_seconds``); ``max_bytes``: see
        :meth:`compile_regex`."""
        started = time.perf_counter() if started is None else started
        self._check_eos(eos)
        n, accepting = dag.num_nodes, dag.accepting
        budget = EdgeBudget(max_bytes, n, pattern)
        budget.check_nodes()
        eos_ids = self._vocab.eos_token_ids if eos else ()
        native = kernels.KERNELS
        spell_ids: npt.NDArray[np.int32] | npt.NDArray[np.intp] | None = None  # the text tokens on edges
        if native is not None:  # the same matching and layout in C (see match_dag)
            if n + len(accepting) >= 1 << 31:
                raise ValueSetError(f"{n + len(accepting)} states exceed triemask's 32-bit state ids")
            try:
                csr = native.match_dag(
                    self._index.native_tables(),
                    dag.in_offsets,
                    dag.source,
                    dag.byte,
                    accepting,
                    np.asarray(eos_ids, dtype=np.int64),
                    self._vocab.vocab_size,
                    budget.max_edges,
                    budget.max_work,
                    0,
                )
            except OverflowError as error:  # over 2**31 edges
                raise ValueSetError(f"{error}") from None
            if isinstance(csr, str):  # stopped when the edges or the walk passed the budget
                budget.refuse(csr)
            offsets, tokens, dests, spell_ids = (np.frombuffer(b, dtype=np.int32) for b in csr)
        else:
            keys = EdgeKeys(n, n + len(accepting), self._vocab.vocab_size)
            found = match_dag_by_class(dag, self._index, keys, budget)
            if found is None:
                found = match_dag(dag, self._index, keys, budget)
            if eos:
                found.append(eos_edges(accepting, n, keys, eos_ids))
            tokens, dests, offsets = keys.csr(found, n)
        if not self._every_byte_is_a_token(dag.byte):
            tokens, dests, offsets, reachable = prune_unreachable(
                n, dag.level_offsets, accepting, tokens, dests, offsets
            )
            if not reachable[accepting].any():
                raise IncompatibleValueError(
                    f"no string of {pattern!r:.80} can be spelled with this vocabulary's text tokens",
                    value=pattern or "",
                    offset=0,
                )
            spell_ids = None  # the pruning dropped edges: their tokens again
        if spell_ids is None:
            spelled = np.zeros(self._vocab.vocab_size, dtype=bool)  # the text tokens used (a sort costs 10x more)
            spelled[tokens[dests < n]] = True
            spell_ids = np.flatnonzero(spelled)
        lengths, starts, data = self._vocab.byte_table()
        spell_lengths = lengths[spell_ids].astype(np.int64)
        spell_offsets = np.zeros(len(spell_ids) + 1, dtype=np.int64)
        np.cumsum(spell_lengths, out=spell_offsets[1:])
        raw = np.frombuffer(data, dtype=np.uint8)
        gather = np.arange(int(spell_offsets[-1])) + np.repeat(starts[spell_ids] - spell_offsets[:-1], spell_lengths)
        pseudo_edges = None if pseudo is None else _dag_piece_edges(dag, pseudo)
        automaton = DagAutomaton(
            dag=dag,
            pattern=pattern,
            spell_ids=spell_ids.astype(np.int32),
            spell_offsets=spell_offsets,
            spell_flat=raw[gather],
            edge_offsets=offsets,
            edge_tokens=tokens,
            edge_dests=dests,
            terminal_nodes=accepting,
            terminal_values=np.arange(len(accepting), dtype=np.int32),
            value_flat=np.zeros(0, dtype=np.uint8),
            value_starts=np.zeros(len(accepting) + 1, dtype=np.int64),
            level_offsets=dag.level_offsets,
            meta=self._meta(eos, values_are_str=True, input_values=len(accepting), started=started),
            compiler=self,
        )
        return automaton, pseudo_edges
