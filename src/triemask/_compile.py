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
import threading
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from . import _kernels
from ._automaton import DagAutomaton, TrieAutomaton, set_fingerprint
from ._errors import ArgumentTypeError, IncompatibleValueError, MemoryLimitError, ValueSetError, integer
from ._lazy import DEFAULT_CACHE_BYTES, LazyTrieAutomaton, lazy_arrays
from ._regex import FORMATS, ByteDag, dag_of_pattern, dag_of_trie, mix64
from ._storage import cache_directory
from ._token_index import TokenIndex
from ._trie import ByteTrie, build_trie
from ._vocabulary import Vocabulary

if TYPE_CHECKING:
    from ._mixed import CompiledSchema
    from ._tools import CompiledTools

__all__ = ["Compiler", "compiler_for_fingerprint"]


# the live compilers of each vocabulary (any of them serves: they index the same tokens)
_BY_FINGERPRINT: dict[str, weakref.WeakSet[Compiler]] = {}
_BY_FINGERPRINT_LOCK = threading.Lock()


def compiler_for_fingerprint(fingerprint: str) -> Compiler:
    """A live compiler of the vocabulary with this fingerprint (for
    :meth:`TrieAutomaton.with_values` called without one)."""
    with _BY_FINGERPRINT_LOCK:
        compiler = next(iter(_BY_FINGERPRINT.get(fingerprint, ())), None)
    if compiler is None:
        raise ArgumentTypeError(
            f"with_values needs the Compiler of the automaton's vocabulary ({fingerprint}) and none is alive "
            "in this process: pass compiler=Compiler(vocab)"
        )
    return compiler


class Compiler:
    """Compiles sets of values against one vocabulary.

    Building a compiler indexes the vocabulary once (about 70 ms for a 150K-token
    vocabulary with the C extension) and keeps the index on disk, named by the
    vocabulary's fingerprint, so that later processes load it instead; every
    :meth:`compile` reuses that index. A compiler holds no per-set state and may be
    shared between threads.

    Parameters
    ----------
    vocab : Vocabulary
        The vocabulary of the model that will be constrained.
    disk_cache : bool
        Load the index from, and save it to, ``cache_dir`` (default True). A cached file
        that fails any check is rebuilt; a folder that cannot be written is skipped
        (``stats()["source"]`` says which happened).
    cache_dir : str or path, optional
        Default ``$TRIEMASK_CACHE``, else ``~/.cache/triemask``.

    Examples
    --------
    >>> from triemask import Compiler, Vocabulary
    >>> vocab = Vocabulary([b"a", b"b", b"ab", None], eos_token_ids=3)
    >>> automaton = Compiler(vocab).compile(["ab", "b"])
    >>> automaton.allowed_token_ids(automaton.initial_state).tolist()
    [0, 1, 2]
    """

    __slots__ = ("__weakref__", "_index", "_index_source", "_vocab")

    def __init__(
        self, vocab: Vocabulary, *, disk_cache: bool = True, cache_dir: str | os.PathLike[str] | None = None
    ) -> None:
        if not isinstance(vocab, Vocabulary):
            raise ArgumentTypeError(f"Compiler needs a triemask.Vocabulary, got {type(vocab).__qualname__}")
        self._vocab = vocab
        directory = (Path(cache_dir) if cache_dir is not None else cache_directory()) if disk_cache else None
        self._index, self._index_source = TokenIndex.cached(vocab, directory)
        with _BY_FINGERPRINT_LOCK:  # for TrieAutomaton.with_values
            for key in [k for k, live in _BY_FINGERPRINT.items() if not live]:
                del _BY_FINGERPRINT[key]
            _BY_FINGERPRINT.setdefault(vocab.fingerprint, weakref.WeakSet()).add(self)

    @property
    def vocab(self) -> Vocabulary:
        """The vocabulary this compiler indexes."""
        return self._vocab

    def single_byte_tokens(self) -> npt.NDArray[np.int64]:
        """For each byte value, the smallest id of a token that is exactly that byte (-1: none)."""
        found = np.full(256, -1, dtype=np.int64)
        lengths, offsets, data = self._vocab.byte_table()
        ids = np.flatnonzero(lengths == 1)
        raw = np.frombuffer(data, dtype=np.uint8)
        order = ids[::-1]  # the smallest id written last
        found[raw[offsets[order]]] = order
        return found

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
        max_bytes = _budget(max_bytes)
        if cache_bytes is not None:
            if layout != "lazy":
                raise ValueSetError(f"cache_bytes applies to layout='lazy' only, not layout={layout!r:.40}")
            cache_bytes = integer(cache_bytes, "cache_bytes", ValueSetError, "a non-negative integer")
            if cache_bytes < 0:
                raise ValueSetError(f"cache_bytes must be a non-negative integer, got {cache_bytes}")
        if layout == "dag":
            automaton: TrieAutomaton = self._compile_set_dag(values, eos=eos)
        elif layout == "lazy":
            limit = DEFAULT_CACHE_BYTES if cache_bytes is None else cache_bytes
            lazy = self._compile_lazy(values, eos=eos, cache_bytes=limit, max_bytes=max_bytes)
            if max_bytes is not None and lazy.memory_bytes + limit > max_bytes:
                raise _over_budget(max_bytes, lazy.memory_bytes + limit, "the trie and the cache bound")
            return lazy
        elif layout != "trie":
            raise ValueSetError(f"layout must be 'trie', 'dag' or 'lazy', got {layout!r:.40}")
        else:
            automaton = self._compile(values, eos=eos, max_bytes=max_bytes)[0]
        if max_bytes is not None and automaton.memory_bytes > max_bytes:
            raise _over_budget(max_bytes, automaton.memory_bytes, "the automaton")
        return automaton

    def compile_regex(self, pattern: str, *, eos: bool = True, max_bytes: int | None = None) -> DagAutomaton:
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
            work done is bounded by it too.

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
        return self._compile_dag(dag_of_pattern(pattern), pattern, eos=eos, max_bytes=_budget(max_bytes))[0]

    def compile_format(self, name: str, *, eos: bool = True) -> DagAutomaton:
        """Compile one of the built-in finite formats: ``date`` (``YYYY-MM-DD``),
        ``time`` and ``date-time`` (RFC 3339, at most 9 fraction digits), ``uuid``,
        ``ipv4``, ``ipv6``. The patterns are in ``triemask.FORMATS``.

        Raises
        ------
        ValueSetError
            ``name`` is not a built-in format (the message lists them).
        """
        pattern = FORMATS.get(name) if isinstance(name, str) else None
        if pattern is None:
            raise ValueSetError(f"unknown format {name!r:.60}: the built-in formats are {', '.join(FORMATS)}")
        return self._compile_dag(dag_of_pattern(pattern), pattern, eos=eos)[0]

    def compile_json_schema(
        self,
        schema: Any,
        *,
        any_whitespace: bool = True,
        indent: int | None = None,
        separators: tuple[str, str] | None = None,
        strict_mode: bool = True,
        min_enum_values: int | None = None,
    ) -> CompiledSchema:
        """Compile a JSON schema: enum fields to tries, the structure to xgrammar.

        Parameters
        ----------
        schema : dict, str or pydantic model class
            The JSON schema (never modified).
        any_whitespace, indent, separators, strict_mode
            As in xgrammar's ``GrammarCompiler.compile_json_schema``: the language
            is the one xgrammar compiles from ``schema`` with these options, kept to
            strict JSON (RFC 8259: no raw control character or invalid UTF-8 inside a
            string, which xgrammar's length-bounded strings admit; ``separators`` a
            comma and a colon with optional whitespace).
        min_enum_values : int, optional
            Enums (and ``anyOf`` / ``oneOf`` of consts) with at least this many
            distinct values go to a trie; smaller ones stay in xgrammar. Default
            :data:`triemask.DEFAULT_MIN_ENUM_VALUES`.

        Raises
        ------
        SchemaError
            The schema is not JSON, has an empty enum, a value no token can spell,
            or something xgrammar rejects; ``.path`` names the field.
        ImportError
            xgrammar is not installed (``pip install 'triemask[schema]'``).
        """
        from ._mixed import DEFAULT_MIN_ENUM_VALUES, CompiledSchema

        return CompiledSchema(
            self,
            schema,
            any_whitespace=any_whitespace,
            indent=indent,
            separators=separators,
            strict_mode=strict_mode,
            min_enum_values=DEFAULT_MIN_ENUM_VALUES if min_enum_values is None else min_enum_values,
        )

    def compile_tools(
        self,
        tools: Any,
        *,
        any_whitespace: bool = True,
        indent: int | None = None,
        separators: tuple[str, str] | None = None,
        strict_mode: bool = True,
        min_enum_values: int | None = None,
        cache_bytes: int | None = None,
    ) -> CompiledTools:
        """Compile a tool list: the output is ``{"name": <a tool>, "arguments": <its parameters>}``.

        The language is that of ``{"anyOf": [{"type": "object", "properties": {"name":
        {"const": name_i}, "arguments": parameters_i}, "required": ["name", "arguments"]},
        ...]}`` compiled with the same options, but nothing per tool is compiled up front:
        the name is a trie, and a tool's arguments are compiled when it is chosen.

        Parameters
        ----------
        tools : list of dict
            OpenAI-style function specs: ``{"name", "description", "parameters"}`` or
            ``{"type": "function", "function": {...}}``.
        any_whitespace, indent, separators, strict_mode, min_enum_values
            As in :meth:`compile_json_schema`, for every tool's arguments.
        cache_bytes : int, optional
            Bound on the compiled argument schemas kept (default 256 MiB).

        Raises
        ------
        SchemaError
            An empty list, a spec without a name, a name given twice (``.path`` names
            it, e.g. ``$[3].function.name``); a tool's bad parameters when that tool
            is first compiled.
        """
        from ._mixed import DEFAULT_MIN_ENUM_VALUES
        from ._tools import DEFAULT_TOOL_CACHE_BYTES, CompiledTools

        return CompiledTools(
            self,
            tools,
            any_whitespace=any_whitespace,
            indent=indent,
            separators=separators,
            strict_mode=strict_mode,
            min_enum_values=DEFAULT_MIN_ENUM_VALUES if min_enum_values is None else min_enum_values,
            cache_bytes=DEFAULT_TOOL_CACHE_BYTES if cache_bytes is None else cache_bytes,
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
        if eos and not self._vocab.eos_token_ids:
            raise ValueSetError(
                "compile(eos=True) needs EOS token ids, and this vocabulary has none: "
                "build the Vocabulary with eos_token_ids=..., or compile with eos=False"
            )
        items, strings, flat, starts, are_str = _encode_values(values)
        if max_bytes is not None and flat.nbytes + starts.nbytes > max_bytes:  # the values alone
            raise _over_budget(max_bytes, flat.nbytes + starts.nbytes, "the values")
        trie = build_trie(flat, starts, strings=strings)
        n, k = trie.num_nodes, trie.num_strings
        eos_ids = self._vocab.eos_token_ids if eos else ()
        # what the automaton takes besides its edges (8 bytes each): offsets, values, maps
        fixed = 4 * (n + 2) + trie.flat.nbytes + trie.starts.nbytes + 8 * k + trie.level_offsets.nbytes
        if max_bytes is not None and fixed > max_bytes:
            raise _over_budget(max_bytes, fixed, f"the trie ({n:,} nodes)")
        max_edges = -1 if max_bytes is None else (max_bytes - fixed) // 8
        native = _kernels.KERNELS
        if native is not None:  # the same matching and layout in C (see _match)
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
                raise _over_budget(max_bytes or 0, fixed + 8 * (max_edges + 1), f"the edges of {n:,} nodes")
            offsets, tokens, dests = (np.frombuffer(b, dtype=np.int32) for b in csr)
        else:
            keys = _EdgeKeys(n, n + k, self._vocab.vocab_size)
            found = _match(trie, self._index, keys)
            if eos:
                found.append(_eos_edges(trie.terminal, trie.num_nodes, keys, eos_ids))
            edges = sum(len(batch) for batch in found)
            if max_bytes is not None and edges > max_edges:
                raise _over_budget(max_bytes, fixed + 8 * edges, f"the edges of {n:,} nodes")
            tokens, dests, offsets = keys.csr(found, n)
        if not self._every_byte_is_a_token(trie.byte[1:]):
            tokens, dests, offsets, reachable = _prune(n, trie.level_offsets, trie.terminal, tokens, dests, offsets)
            spelled = reachable[trie.terminal]
            if not spelled.all():
                _raise_incompatible(trie, self._index, reachable, int(np.flatnonzero(~spelled)[0]), are_str)
        terminal_order = np.argsort(trie.terminal, kind="stable").astype(np.int32)
        pseudo_edges = None
        if pseudo is not None:
            pseudo_keys = _EdgeKeys(n, n, pseudo.vocab.vocab_size)
            pseudo_edges = pseudo_keys.csr(_match(trie, pseudo, pseudo_keys), n)
        automaton = TrieAutomaton(
            edge_offsets=offsets,
            edge_tokens=tokens,
            edge_dests=dests,
            terminal_nodes=trie.terminal[terminal_order],
            terminal_values=terminal_order,
            value_flat=trie.flat,
            value_starts=trie.starts,
            values_are_str=are_str,
            input_values=len(items),
            level_offsets=trie.level_offsets,
            vocab_size=self._vocab.vocab_size,
            vocab_fingerprint=self._vocab.fingerprint,
            eos_token_ids=self._vocab.eos_token_ids,
            eos=eos,
            compile_seconds=time.perf_counter() - started,
        )
        return automaton, pseudo_edges

    def _compile_lazy(
        self, values: Iterable[str] | Iterable[bytes], *, eos: bool, cache_bytes: int, max_bytes: int | None
    ) -> LazyTrieAutomaton:
        started = time.perf_counter()
        if eos and not self._vocab.eos_token_ids:
            raise ValueSetError(
                "compile(eos=True) needs EOS token ids, and this vocabulary has none: "
                "build the Vocabulary with eos_token_ids=..., or compile with eos=False"
            )
        items, strings, flat, starts, are_str = _encode_values(values)
        trie = build_trie(flat, starts, strings=strings)
        n, k = trie.num_nodes, trie.num_strings
        needed = 3 * n + 8 * k + cache_bytes  # node words and bytes, value maps, the cache bound
        if max_bytes is not None and needed > max_bytes:
            raise _over_budget(max_bytes, needed, f"the trie ({n:,} nodes) and the cache bound")
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
            values_are_str=are_str,
            input_values=len(items),
            level_offsets=trie.level_offsets,
            vocab_size=self._vocab.vocab_size,
            vocab_fingerprint=self._vocab.fingerprint,
            eos_token_ids=self._vocab.eos_token_ids,
            eos=eos,
            compile_seconds=time.perf_counter() - started,
        )

    def _compile_set_dag(self, values: Iterable[str] | Iterable[bytes], *, eos: bool) -> DagAutomaton:
        started = time.perf_counter()
        items, strings, flat, starts, are_str = _encode_values(values)
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
        with several parents per node (see ``_match_dag``). ``started``: when the
        caller's part of the compile began (for ``compile_seconds``); ``max_bytes``: see
        :meth:`compile_regex`."""
        started = time.perf_counter() if started is None else started
        if eos and not self._vocab.eos_token_ids:
            raise ValueSetError(
                "compile(eos=True) needs EOS token ids, and this vocabulary has none: "
                "build the Vocabulary with eos_token_ids=..., or compile with eos=False"
            )
        n, accepting = dag.num_nodes, dag.accepting
        keys = _EdgeKeys(n, n + len(accepting), self._vocab.vocab_size)
        budget = _EdgeBudget(max_bytes, n, pattern)
        found = _match_dag_by_class(dag, self._index, keys, budget)
        if found is None:
            found = _match_dag(dag, self._index, keys, budget)
        if eos:
            found.append(_eos_edges(accepting, n, keys, self._vocab.eos_token_ids))
        tokens, dests, offsets = keys.csr(found, n)
        if not self._every_byte_is_a_token(dag.byte):
            tokens, dests, offsets, reachable = _prune(n, dag.level_offsets, accepting, tokens, dests, offsets)
            if not reachable[accepting].any():
                raise IncompatibleValueError(
                    f"no string of {pattern!r:.80} can be spelled with this vocabulary's text tokens",
                    value=pattern or "",
                    offset=0,
                )
        spell_ids = np.unique(tokens[dests < n])
        lengths, starts, data = self._vocab.byte_table()
        spell_lengths = lengths[spell_ids].astype(np.int64)
        spell_offsets = np.zeros(len(spell_ids) + 1, dtype=np.int64)
        np.cumsum(spell_lengths, out=spell_offsets[1:])
        raw = np.frombuffer(data, dtype=np.uint8)
        gather = np.arange(int(spell_offsets[-1])) + np.repeat(starts[spell_ids] - spell_offsets[:-1], spell_lengths)
        pseudo_edges = None
        if pseudo is not None:
            pseudo_keys = _EdgeKeys(n, n, pseudo.vocab.vocab_size)
            pseudo_edges = pseudo_keys.csr(_match_dag(dag, pseudo, pseudo_keys), n)
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
            values_are_str=True,
            input_values=len(accepting),
            level_offsets=dag.level_offsets,
            vocab_size=self._vocab.vocab_size,
            vocab_fingerprint=self._vocab.fingerprint,
            eos_token_ids=self._vocab.eos_token_ids,
            eos=eos,
            compile_seconds=time.perf_counter() - started,
        )
        return automaton, pseudo_edges


def compile_with_pseudo_tokens(
    compiler: Compiler, values: list[bytes], pseudo: TokenIndex
) -> tuple[TrieAutomaton, tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]]]:
    """Compile ``values`` (``eos=False``) and match a second token table against the
    same trie: the CSR ``(tokens, dests, offsets)`` of its edges, by node id.

    The mixed-schema compiler matches pieces of tokens (the part before a value's
    end, the part after a value's start) this way, with the same linear pass.
    """
    automaton, edges = compiler._compile(values, eos=False, pseudo=pseudo)
    assert edges is not None
    return automaton, edges


def compile_pattern_with_pseudo_tokens(
    compiler: Compiler, pattern: str, pseudo: TokenIndex
) -> tuple[DagAutomaton, tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]]]:
    """:func:`compile_with_pseudo_tokens` for a finite pattern (a string field's
    language, quotes included)."""
    automaton, edges = compiler._compile_dag(dag_of_pattern(pattern), pattern, eos=False, pseudo=pseudo)
    assert edges is not None
    return automaton, edges


def _budget(max_bytes: int | None) -> int | None:
    """``max_bytes`` checked: None, or a positive integer (``ValueSetError`` otherwise)."""
    if max_bytes is None:
        return None
    max_bytes = integer(max_bytes, "max_bytes", ValueSetError, "a positive integer")
    if max_bytes <= 0:
        raise ValueSetError(f"max_bytes must be a positive integer, got {max_bytes}")
    return max_bytes


class _EdgeBudget:
    """The edges an acyclic automaton's compile may make within ``max_bytes`` (8 bytes each
    in the automaton, 8 more while they are sorted), spent as the matching finds them and
    checked against what the next step will hold, so a hostile pattern is refused after
    work proportional to the budget, before the large allocations."""

    BYTES_PER_EDGE = 16
    WORK_PER_EDGE = 1  # frontier entries the matching may visit per edge of the budget

    def __init__(self, max_bytes: int | None, num_nodes: int, pattern: str | None) -> None:
        self.max_bytes = max_bytes
        fixed = 16 * (num_nodes + 1)  # the offsets and levels
        self.max_edges = -1 if max_bytes is None else (max_bytes - fixed) // self.BYTES_PER_EDGE
        self.spent = self.work = 0
        self.what = f"the automaton of {pattern!r:.60}" if pattern is not None else "the automaton"

    def spend(self, edges: int, frontier: int) -> None:
        """``edges`` found; the next step visits ``frontier`` entries (the work, bounded too:
        most of a wide pattern's paths end in no token, and cost all the same)."""
        self.spent += edges
        self.work += frontier
        if self.max_bytes is None:
            return
        if max(self.spent, frontier) > self.max_edges:
            self._refuse(max(self.spent, frontier))
        if self.work > self.WORK_PER_EDGE * self.max_edges:
            raise MemoryLimitError(
                f"matching {self.what} against this vocabulary visits more than {self.work:,} paths, more "
                f"than max_bytes={self.max_bytes:,} allows ({self.WORK_PER_EDGE} per edge it could hold)",
                limit=self.max_bytes,
                needed=self.work // self.WORK_PER_EDGE * self.BYTES_PER_EDGE,
            )

    def check_total(self, edges: int) -> None:
        if self.max_bytes is not None and edges > self.max_edges:
            self._refuse(edges)

    def _refuse(self, edges: int) -> None:
        assert self.max_bytes is not None
        raise MemoryLimitError(
            f"{self.what} needs at least {edges * self.BYTES_PER_EDGE:,} bytes for its edges with this "
            f"vocabulary, more than max_bytes={self.max_bytes:,}",
            limit=self.max_bytes,
            needed=edges * self.BYTES_PER_EDGE,
        )


def _over_budget(limit: int, needed: int, what: str) -> MemoryLimitError:
    return MemoryLimitError(
        f"the set needs at least {needed:,} bytes for {what}, more than max_bytes={limit:,}: "
        "raise the limit, split the set, or use layout='dag' for sets with common endings",
        limit=limit,
        needed=needed,
    )


# --------------------------------------------------------------------------- values


def _encode_values(
    values: Iterable[str] | Iterable[bytes],
) -> tuple[list[Any], list[bytes] | None, npt.NDArray[np.uint8], npt.NDArray[np.int64], bool]:
    """The values as UTF-8: one buffer plus offsets (and a list of bytes for the NumPy
    trie construction), without a Python loop over the values when they hold no NUL."""
    if not isinstance(values, Iterable):
        raise ValueSetError(f"values must be an iterable of strings, got {type(values).__name__} {values!r:.40}")
    if isinstance(values, (str, bytes, bytearray)):
        raise ValueSetError(
            f"values must be an iterable of strings, got a single {type(values).__name__} {values[:40]!r}; "
            "wrap it in a list"
        )
    items: list[Any] = values if isinstance(values, list) else list(values)
    if not items:
        raise ValueSetError("cannot compile an empty set of values")
    try:
        joined = "\x00".join(items)
        are_str = True
    except TypeError:
        joined = None
        are_str = False
    if are_str:
        assert joined is not None
        try:
            data = joined.encode("utf-8")
        except UnicodeEncodeError:
            for i, item in enumerate(items):
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError as exc:  # noqa: PERF203 - only on the error path
                    raise ValueSetError(f"value #{i} {item!r} is not valid Unicode: {exc.reason}") from None
            raise
    else:
        expected = str if isinstance(items[0], str) else (bytes, bytearray, memoryview)
        for i, item in enumerate(items):
            if not isinstance(item, expected):
                raise ValueSetError(
                    f"values must be all str or all bytes; value #{i} is {type(item).__name__}: {item!r}"
                )
        data = b"\x00".join(items)
    raw = np.frombuffer(data, dtype=np.uint8)
    cuts = np.flatnonzero(raw == 0)
    k = len(items)
    strings: list[bytes] | None
    if len(cuts) != k - 1:  # some value holds a NUL: encode one by one
        encoded = [item.encode("utf-8") if are_str else bytes(item) for item in items]
        flat = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=k)
        strings = encoded
    else:
        # (the NumPy trie construction pads Python bytes faster; the C one reads flat)
        strings = data.split(b"\x00") if _kernels.KERNELS is None else None
        keep = np.ones(len(raw), dtype=bool)
        keep[cuts] = False
        flat = raw[keep]
        bounds = np.concatenate(([-1], cuts, [len(raw)]))
        lengths = np.diff(bounds) - 1
    starts = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    return items, strings, flat, starts, are_str


# --------------------------------------------------------------------------- matching


class _EdgeKeys:
    """Packs an edge ``(source, token, destination)`` into one uint64 whose order is
    (source, token): sorting the keys groups edges by node, tokens ascending.

    When the three do not fit 64 bits (about 2^23 states with a 262K vocabulary), a key is
    two uint64 columns instead, ``(source, token)`` and the destination: twice the memory
    and an argsort instead of a sort, so there is no limit on the number of nodes.
    """

    def __init__(self, num_nodes: int, num_states: int, vocab_size: int) -> None:
        self.token_bits = max(int(vocab_size - 1).bit_length(), 1)
        self.dest_bits = max(int(num_states - 1).bit_length(), 1)
        self.wide = int(num_nodes).bit_length() + self.token_bits + self.dest_bits > 64
        shift = self.token_bits if self.wide else self.token_bits + self.dest_bits
        self.source_shift = np.uint64(shift)
        self.token_shift = np.uint64(0 if self.wide else self.dest_bits)

    def pack(
        self, sources: npt.NDArray[Any], tokens: npt.NDArray[Any], dests: npt.NDArray[np.uint64]
    ) -> npt.NDArray[np.uint64]:
        keys: npt.NDArray[np.uint64] = (sources.astype(np.uint64) << self.source_shift) | (
            tokens.astype(np.uint64) << self.token_shift
        )
        if self.wide:
            return np.stack([keys, dests.astype(np.uint64, copy=False)], axis=1)
        return keys | dests.astype(np.uint64, copy=False)

    def csr(
        self, batches: list[npt.NDArray[np.uint64]], num_nodes: int
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """Sort the keys and split them into CSR arrays (tokens, destinations, offsets)."""
        empty = np.zeros((0, 2) if self.wide else 0, dtype=np.uint64)
        keys = np.concatenate(batches) if batches else empty
        if self.wide:  # (source, token) are distinct: their order is the edges' order
            keys = keys[np.argsort(keys[:, 0])]
            dests = keys[:, 1].astype(np.int32)
            keys = keys[:, 0]
        else:
            keys.sort()
            dests = (keys & np.uint64((1 << self.dest_bits) - 1)).astype(np.int32)
        sources = keys >> self.source_shift
        tokens = ((keys >> self.token_shift) & np.uint64((1 << self.token_bits) - 1)).astype(np.int32)
        offsets = np.zeros(num_nodes + 2, dtype=np.int64)  # counting is 3x faster than searchsorted here
        np.cumsum(np.bincount(sources.astype(np.intp), minlength=num_nodes + 1), out=offsets[1:])
        if len(keys) >= 1 << 31:  # pragma: no cover - over 2**31 edges
            raise ValueSetError(f"{len(keys)} edges exceed triemask's 32-bit offsets; split the set")
        return tokens, dests, offsets.astype(np.int32)


def _match(trie: ByteTrie, index: TokenIndex, keys: _EdgeKeys) -> list[npt.NDArray[np.uint64]]:
    """All allowed text edges, as packed keys, in batches."""
    parent, byte = trie.parent, trie.byte
    n = trie.num_nodes
    ends = np.arange(1, n, dtype=np.uint64)  # m
    starts = parent[1:]  # a, the start of the path a -> m
    suffix = index.step(np.zeros(n - 1, dtype=np.int32), byte[1:], 0)  # u, that path reversed
    found: list[npt.NDArray[np.uint64]] = []
    level = 1
    while suffix.size:
        token = index.first_token[suffix]
        whole = token >= 0
        found.append(keys.pack(starts, token, ends)[whole])
        if index.dup_tokens is not None:
            found.extend(_duplicate_edges(index, keys, starts[whole], suffix[whole], ends[whole]))
        grow = index.has_children[suffix]
        grow &= starts != 0
        starts, ends, suffix = starts[grow], ends[grow], suffix[grow]
        suffix = index.step(suffix, byte[starts], level)
        starts = parent[starts]
        level += 1
    return found


def _match_dag(
    dag: ByteDag, index: TokenIndex, keys: _EdgeKeys, budget: _EdgeBudget | None = None
) -> list[npt.NDArray[np.uint64]]:
    """``_match`` over an acyclic automaton: a node may have several incoming edges,
    so each step up the automaton fans a frontier entry out over the edges into its
    start. Determinism keeps the triples (start, end, token suffix) distinct: from a
    start node, a byte string leads to one end node at most."""
    in_offsets, in_degree = dag.in_offsets, np.diff(dag.in_offsets)
    starts = dag.source.astype(np.int64)  # a
    ends = dag.dest.astype(np.uint64)  # m
    suffix = index.step(np.zeros(dag.num_edges, dtype=np.int32), dag.byte, 0)  # u, the path a -> m reversed
    found: list[npt.NDArray[np.uint64]] = []
    level = 1
    while suffix.size:
        token = index.first_token[suffix]
        whole = token >= 0
        found.append(keys.pack(starts[whole], token[whole], ends[whole]))
        if index.dup_tokens is not None:
            found.extend(_duplicate_edges(index, keys, starts[whole], suffix[whole], ends[whole]))
        grow = index.has_children[suffix]
        grow &= in_degree[starts] > 0
        starts, ends, suffix = starts[grow], ends[grow], suffix[grow]
        counts = in_degree[starts]
        total = int(counts.sum())
        if budget is not None:
            budget.spend(len(found[-1]), total)
        entry = np.repeat(np.arange(len(starts)), counts)
        edge = np.arange(total) + np.repeat(in_offsets[starts] - (np.cumsum(counts) - counts), counts)
        suffix = index.step(suffix[entry], dag.byte[edge], level)
        starts, ends = dag.source[edge].astype(np.int64), ends[entry]
        level += 1
    return found


def _byte_classes(dag: ByteDag) -> tuple[npt.NDArray[np.int64], int] | None:
    """Bytes that label exactly the same (source, destination) pairs are interchangeable:
    a class id per byte (-1 for bytes on no edge) and the number of classes, or None when
    classes would not merge at least half of the bytes (then byte matching is as cheap)."""
    order = np.lexsort((dag.dest, dag.source, dag.byte))
    byte = dag.byte[order]
    pair = (dag.source[order].astype(np.uint64) << np.uint64(32)) | dag.dest[order].astype(np.uint64)
    count = np.bincount(byte, minlength=256)
    used = np.flatnonzero(count)
    start = np.concatenate(([0], np.cumsum(count)))
    with np.errstate(over="ignore"):
        signature = np.zeros(256, dtype=np.uint64)
        np.add.at(signature, byte, mix64(pair))
        signature += count.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    _, first, inverse = np.unique(signature[used], return_index=True, return_inverse=True)
    if 2 * len(first) > len(used):
        return None
    # exact check: each byte's sorted pairs equal its class representative's
    representative = used[first][inverse]
    rank = np.arange(len(byte)) - start[byte]
    if not np.array_equal(pair, pair[start[representative[np.searchsorted(used, byte)]] + rank]):
        return None  # a hash collision: match byte by byte
    classes = np.full(256, -1, dtype=np.int64)
    classes[used] = inverse.reshape(-1)
    return classes, len(first)


def _match_dag_by_class(
    dag: ByteDag, index: TokenIndex, keys: _EdgeKeys, budget: _EdgeBudget | None = None
) -> list[npt.NDArray[np.uint64]] | None:
    """``_match_dag`` over byte *classes*, for automata whose edges carry many
    interchangeable bytes (``[0-9A-Fa-f]``): tokens whose bytes have the same classes
    are allowed in the same places, so the matching runs once per class string.

    1. The token suffixes made of bytes the automaton uses are enumerated in the token
       index (children are contiguous), and each is mapped to its class string, building
       the (reversed) trie of class strings and the tokens that end at each of its nodes.
    2. The backward matching of ``_match_dag`` runs on the automaton with class labels
       against that small trie.
    3. Each edge ``a --class string--> m`` becomes an edge for every token of the string.

    Returns None when the classes do not merge enough bytes to pay.
    """
    found_classes = _byte_classes(dag)
    if found_classes is None:
        return None
    classes, k = found_classes
    # the class-labelled automaton: one edge per (source, class, destination), sorted by
    # destination (determinism then keeps the matching's triples distinct)
    n = dag.num_nodes
    labelled = np.unique((dag.dest.astype(np.int64) * n + dag.source) * k + classes[dag.byte])
    dag_class = labelled % k
    edge_source = (labelled // k) % n
    edge_dest = labelled // (k * n)
    in_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(edge_dest, minlength=n), out=in_offsets[1:])
    # class b may come right before class c only if some node has an edge of b in and of c out
    out_offsets = np.zeros(n + 1, dtype=np.int64)
    by_source = np.argsort(edge_source, kind="stable")
    np.cumsum(np.bincount(edge_source, minlength=n), out=out_offsets[1:])
    outs = np.diff(out_offsets)
    pairs_in = np.repeat(np.arange(len(labelled)), outs[edge_dest])
    pairs_out = by_source[
        np.arange(len(pairs_in))
        + np.repeat(out_offsets[edge_dest] - (np.cumsum(outs[edge_dest]) - outs[edge_dest]), outs[edge_dest])
    ]
    follows = np.zeros(k * k, dtype=bool)
    follows[dag_class[pairs_in] * k + dag_class[pairs_out]] = True
    # 1. the (reversed) trie of the class strings of token suffixes made of used bytes,
    # level by level, only as long as the automaton's longest path and along class pairs
    # that can follow each other
    u = np.zeros(1, dtype=np.int64)  # token index nodes
    c = np.zeros(1, dtype=np.int64)  # class trie nodes
    last = np.full(1, -1, dtype=np.int64)  # the class that starts the suffix so far (-1: none)
    nodes = 1
    table_keys, table_children, visited_u, visited_c = [], [], [], []
    for _ in range(len(dag.level_offsets) - 2):
        counts = index.child_offsets[u + 1] - index.child_offsets[u]
        child = np.arange(int(counts.sum())) + np.repeat(index.child_offsets[u] - (np.cumsum(counts) - counts), counts)
        parent_c, parent_last = np.repeat(c, counts), np.repeat(last, counts)
        label = classes[index.node_byte[child]]
        pair = np.maximum(label, 0) * k + np.maximum(parent_last, 0)
        keep = (label >= 0) & ((parent_last < 0) | follows[pair])
        child, parent_c, label = child[keep], parent_c[keep], label[keep]
        if not child.size:
            break
        step_keys, inverse = np.unique(parent_c * k + label, return_inverse=True)
        table_keys.append(step_keys)
        table_children.append(np.arange(nodes, nodes + len(step_keys)))
        u, c, last = child, nodes + inverse.reshape(-1), label
        nodes += len(step_keys)
        visited_u.append(u)
        visited_c.append(c)
    if not visited_u:
        return []
    all_u, all_c = np.concatenate(visited_u), np.concatenate(visited_c)
    step = np.full(nodes * k + 1, nodes, dtype=np.int64)  # sentinel `nodes`: no such class string
    step[np.concatenate(table_keys)] = np.concatenate(table_children)
    has_children = np.zeros(nodes + 1, dtype=bool)
    has_children[np.concatenate(table_keys) // k] = True
    # tokens ending at each class trie node (first ids and duplicates)
    token = index.first_token[all_u]
    whole = token >= 0
    groups_c, groups_t = [all_c[whole]], [token[whole]]
    if index.dup_tokens is not None and index.dup_offsets is not None:
        lo = index.dup_offsets[all_u]
        dup_counts = index.dup_offsets[all_u + 1] - lo
        total = int(dup_counts.sum())
        if total:
            at = np.arange(total) + np.repeat(lo - (np.cumsum(dup_counts) - dup_counts), dup_counts)
            groups_c.append(np.repeat(all_c, dup_counts))
            groups_t.append(index.dup_tokens[at])
    group_c, group_t = np.concatenate(groups_c), np.concatenate(groups_t)
    order = np.argsort(group_c, kind="stable")
    group_t = group_t[order]
    group_offsets = np.zeros(nodes + 2, dtype=np.int64)
    np.cumsum(np.bincount(group_c, minlength=nodes + 1), out=group_offsets[1:])
    # 2. backward matching on the class-labelled automaton
    in_degree = np.diff(in_offsets)
    starts, ends = edge_source, edge_dest
    suffix = step[dag_class]  # from the class trie's root (node 0)
    hits_a, hits_c, hits_m = [], [], []
    while suffix.size:
        has_tokens = group_offsets[suffix + 1] > group_offsets[suffix]
        hits_a.append(starts[has_tokens])
        hits_c.append(suffix[has_tokens])
        hits_m.append(ends[has_tokens])
        grow = has_children[suffix] & (in_degree[starts] > 0)
        starts, ends, suffix = starts[grow], ends[grow], suffix[grow]
        counts = in_degree[starts]
        if budget is not None:  # each class string is one token at least: a lower bound of the edges
            budget.spend(len(hits_a[-1]), int(counts.sum()))
        entry = np.repeat(np.arange(len(starts)), counts)
        edge = np.arange(int(counts.sum())) + np.repeat(in_offsets[starts] - (np.cumsum(counts) - counts), counts)
        suffix = step[suffix[entry] * k + dag_class[edge]]
        starts, ends = edge_source[edge], ends[entry]
    # 3. one edge per token of each matched class string
    a, cs, m = np.concatenate(hits_a), np.concatenate(hits_c), np.concatenate(hits_m)
    sizes = group_offsets[cs + 1] - group_offsets[cs]
    if budget is not None:
        budget.check_total(int(sizes.sum()))
    at = np.arange(int(sizes.sum())) + np.repeat(group_offsets[cs] - (np.cumsum(sizes) - sizes), sizes)
    return [keys.pack(np.repeat(a, sizes), group_t[at], np.repeat(m, sizes).astype(np.uint64))]


def _duplicate_edges(
    index: TokenIndex, keys: _EdgeKeys, a: npt.NDArray[Any], u: npt.NDArray[Any], m: npt.NDArray[np.uint64]
) -> list[npt.NDArray[np.uint64]]:
    """Edges for the other ids of tokens whose bytes equal another token's."""
    assert index.dup_offsets is not None and index.dup_tokens is not None
    lo = index.dup_offsets[u]
    counts = index.dup_offsets[u + 1] - lo
    total = int(counts.sum())
    if not total:
        return []
    which = np.repeat(np.arange(len(u)), counts)
    position = np.arange(total) + np.repeat(lo - (np.cumsum(counts) - counts), counts)
    return [keys.pack(a[which], index.dup_tokens[position], m[which])]


def _eos_edges(
    terminal: npt.NDArray[np.int32], num_nodes: int, keys: _EdgeKeys, eos_ids: tuple[int, ...]
) -> npt.NDArray[np.uint64]:
    """``terminal[i] --eos--> final state num_nodes + i`` for every EOS id."""
    k = len(terminal)
    sources = np.repeat(terminal, len(eos_ids))
    tokens = np.tile(np.asarray(eos_ids, dtype=np.int64), k)
    finals = np.repeat(np.arange(num_nodes, num_nodes + k, dtype=np.uint64), len(eos_ids))
    return keys.pack(sources, tokens, finals)


# --------------------------------------------------------------------------- rare path


def _prune(
    n: int,
    levels: npt.NDArray[np.int64],
    terminal: npt.NDArray[np.int32],
    tokens: npt.NDArray[np.int32],
    dests: npt.NDArray[np.int32],
    offsets: npt.NDArray[np.int32],
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.bool_]]:
    """For vocabularies lacking some single-byte token: drop edges into nodes from
    which no token sequence completes a value (the masks never lead into a dead
    end). Also returns which states the remaining edges reach from the start.

    Nodes are numbered by level and every edge leads to a deeper level (a trie's
    depth, a DAG's longest distance from the start), so one sweep each way settles it.
    """
    live = np.zeros(n + len(terminal), dtype=bool)  # one final state per terminal
    live[terminal] = True
    live[n:] = True  # final states
    for depth in range(len(levels) - 2, -1, -1):  # edges lead deeper: settle the deep levels first
        lo, hi = int(levels[depth]), int(levels[depth + 1])
        e_lo, e_hi = int(offsets[lo]), int(offsets[hi])
        if e_hi > e_lo:
            reached = np.concatenate(([0], np.cumsum(live[dests[e_lo:e_hi]])))
            live[lo:hi] |= reached[offsets[lo + 1 : hi + 1] - e_lo] > reached[offsets[lo:hi] - e_lo]
    keep = live[dests]
    kept_before = np.concatenate(([0], np.cumsum(keep)))
    tokens, dests, offsets = tokens[keep], dests[keep], kept_before[offsets].astype(np.int32)
    reachable = np.zeros(len(live), dtype=bool)
    reachable[0] = True
    for depth in range(len(levels) - 1):
        lo, hi = int(levels[depth]), int(levels[depth + 1])
        from_reached = np.repeat(reachable[lo:hi], np.diff(offsets[lo : hi + 1]))
        reachable[dests[int(offsets[lo]) : int(offsets[hi])][from_reached]] = True
    return tokens, dests, offsets, reachable


def _raise_incompatible(
    trie: ByteTrie, index: TokenIndex, reachable: npt.NDArray[np.bool_], value_index: int, are_str: bool
) -> None:
    raw = trie.string(value_index)
    value: str | bytes = raw.decode("utf-8") if are_str else raw
    for offset, b in enumerate(raw):
        if not index.byte_in_token[b]:
            raise IncompatibleValueError(
                f"value {value!r} cannot be spelled with this vocabulary's text tokens: byte 0x{b:02x} "
                f"at offset {offset} occurs in no text token",
                value=value,
                offset=offset,
            )
    path = [int(trie.terminal[value_index])]
    while path[-1] != 0:
        path.append(int(trie.parent[path[-1]]))
    spellable = max(depth for depth, node in enumerate(reversed(path)) if reachable[node])
    raise IncompatibleValueError(
        f"value {value!r} cannot be spelled with this vocabulary's text tokens: the longest prefix "
        f"a token sequence can produce is {raw[:spellable]!r} (offset {spellable}), and no token "
        "sequence continues from there to the end of the value",
        value=value,
        offset=spellable,
    )
