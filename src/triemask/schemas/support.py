"""What a vocabulary needs for mixed schemas: its tokens cut into pieces around value boundaries."""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Hashable
from dataclasses import dataclass
from functools import cache, cached_property
from importlib.metadata import version
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from ..base import BoundedLRU, SchemaError, bitmask_width, kernels
from ..vocab import TokenIndex, Vocabulary
from .json_lexer import Lexical
from .structure import (
    CONTROL_SENTINEL_LEAD,
    SENTINEL_LEAD,
    VALUE_FIRST,
    check_entry_unforgeable,
    sentinel_ebnf,
    structure_grammar,
    value_ends,
    value_start_offsets,
    value_starts,
)


class Pieces:
    """Pieces of tokens around value boundaries, indexed for matching against tries.

    Three kinds, per token: a *tail* (from a possible value start to the token's end),
    a *head* (from the token's start to a possible value end) and a *middle* (a whole
    value inside the token, from a start to an end). Heads are kept per piece with
    what follows them in the token (the *rest*), since every trie node a head ends a
    value from shares them.
    """

    def __init__(self, support: VocabularySupport, first: bytes, last: bytes) -> None:
        ids: dict[bytes, int] = {}
        # (piece, token, start, end, prefix id of the token's bytes before the start or -1,
        # 1 where the piece ends with the token: a tail): tails and middles
        enters: list[tuple[int, int, int, int, int, int]] = []
        heads: list[tuple[int, int, int]] = []  # (piece, token, end)
        # only the tokens with a place a value may start or end, in id order as the pieces
        # are numbered (value_starts / value_ends: value_start_offsets / value_end_offsets
        # of every token at once)
        lengths, offsets, text = support.vocab.byte_table()
        start_ids, start_at = value_starts(text, offsets[: len(lengths)], lengths, first)
        end_ids, end_at = value_ends(text, offsets[: len(lengths)], lengths, last)
        never = support.lexical.never
        candidates = np.union1d(start_ids, end_ids)
        candidates = candidates[~never[candidates]]
        # each candidate's places, sliced from the lists (a searchsorted per token: 10x slower)
        start_bounds = np.searchsorted(start_ids, np.stack([candidates, candidates + 1])).T.tolist()
        end_bounds = np.searchsorted(end_ids, np.stack([candidates, candidates + 1])).T.tolist()
        start_list, end_list = start_at.tolist(), end_at.tolist()
        for t, (lo, hi), (end_lo, end_hi) in zip(candidates.tolist(), start_bounds, end_bounds, strict=True):
            data = support.tokens[t]
            assert data is not None
            starts, ends = start_list[lo:hi], end_list[end_lo:end_hi]
            for j in starts:
                prefix = support.prefix_ids.get(data[:j], -1)
                enters.append((ids.setdefault(data[j:], len(ids)), t, j, len(data), prefix, 1))
                enters.extend(
                    (ids.setdefault(data[j:i], len(ids)), t, j, i, prefix, int(i == len(data))) for i in ends if i > j
                )
            heads.extend((ids.setdefault(data[:i], len(ids)), t, i) for i in ends)
        self.pieces: list[bytes] = list(ids)
        # the tails and middles, for a field's compile to pick the few its trie reaches
        self.enters = np.array(enters, dtype=np.int64).reshape(-1, 6)
        heads.sort()
        table = np.array(heads, dtype=np.int64).reshape(-1, 3)
        self.head_offsets = np.searchsorted(table[:, 0], np.arange(len(ids) + 1)).astype(np.int64)
        self.head_tokens = table[:, 1].copy()
        self.head_tokens_view = self.head_tokens.data
        self.head_ends = table[:, 2].astype(np.int32)
        rests = [support.tokens[t][e:] for t, e in zip(table[:, 1].tolist(), table[:, 2].tolist(), strict=True)]
        self.head_rest_tokens = np.array([support.token_ids.get(r, -1) for r in rests], dtype=np.int64)
        # What decides a rest without a probe, from the structure's mask after the value:
        # the longest prefix of the rest that is a token (refused: the rest cannot be
        # structure alone), and where the rest could start a value again (the extra
        # token of that prefix says whether a value may start there): see SchemaEngine._exit_tokens.
        self.head_prefix_tokens = np.array([_longest_token_prefix(r, support.token_ids) for r in rests], dtype=np.int64)
        cross = np.array([_single_start(r, support.prefix_ids) for r in rests], dtype=np.int64)
        # as token ids of xgrammar's vocabulary: (rest, longest token prefix, extra token of a start)
        self.head_lookups = np.stack(
            [self.head_rest_tokens, self.head_prefix_tokens, np.where(cross >= 0, cross + support.first_pseudo, cross)]
        )
        self.index = TokenIndex(Vocabulary(self.pieces or [b"\x00"], eos_token_ids=None))
        self.bytes_sets = (first, last)

    @cached_property
    def fingerprint(self) -> str:
        """A saved schema numbers pieces: it loads only where the same pieces are built
        (computed when a schema is saved or loaded)."""
        first, last = self.bytes_sets
        digest = hashlib.blake2b(first + b"\x00" + last, digest_size=16)
        digest.update(np.array([len(p) for p in self.pieces], dtype="<i8").tobytes())
        digest.update(b"".join(self.pieces))
        return digest.hexdigest()


def _longest_token_prefix(data: bytes, token_ids: dict[bytes, int]) -> int:
    for end in range(len(data), 0, -1):
        token = token_ids.get(data[:end])
        if token is not None:
            return token
    return -1


def _single_start(data: bytes, prefix_ids: dict[bytes, int]) -> int:
    """-2: no value can start in ``data``; the prefix id of its one possible start; -1: unknown."""
    starts = value_start_offsets(data, VALUE_FIRST)
    if not starts:
        return -2
    if len(starts) == 1 and data[: starts[0]] in prefix_ids:
        return prefix_ids[data[: starts[0]]]
    return -1


SKELETON_CACHE_BYTES = 512 << 20
"""Bound on the structural grammars kept per vocabulary (by xgrammar's size of each): vLLM's
bound on xgrammar's own cache (``VLLM_XGRAMMAR_CACHE_MB``, 512). Where it is full, each new
structure frees one kept before, on the compile's path (0.7 ms for a schema of 50 tools'
1.5 MB grammar: 3% of its compile); xgrammar's default compiler keeps every grammar."""

XGRAMMAR_CACHE_BYTES = 16 << 20
"""Bound on xgrammar's own caches for the schemas without trie fields, per vocabulary (its
``cache_limit_bytes``). They keep the token masks of each grammar rule it compiled (by the
rule's automaton), which every later grammar with that rule reuses: the JSON string's rule is
13 of the 14 ms of a function's arguments on Qwen, and a new schema with strings compiles in
1.5 ms after the first (xgrammar's default, as vLLM runs it). They keep compiled grammars by
schema text too, the objects the skeletons hold (shared, not copied); the rules' masks are small
(bounded at 1 MB, a new schema with strings still compiled in 1.7 ms after ten schemas of 50
tools). The structures with 0x01 sentinels compile through the same caches
(:meth:`VocabularySupport.compile_structure`); not those with 0xFF sentinels: xgrammar's
cache keys a parsed grammar by its printed EBNF and compiles that text again, which reads a
sentinel's raw byte 0xFF as the code point U+00FF (bytes C3 BF)."""


@dataclass(frozen=True)
class Skeleton:
    """A schema structure compiled once: xgrammar's EBNF (with the first compile's
    placeholders, which the fields of every later schema of this skeleton take), and the
    compiled grammar with the fields' sentinels. A schema without trie fields is compiled by
    xgrammar's ``compile_json_schema`` directly: no EBNF is kept (empty), none is needed."""

    ebnf: str
    placeholders: tuple[str, ...]  # by site
    grammar: Any
    controls: bool  # the grammar may admit a raw control character in a string (controls_in_strings)
    lead: int  # the extra tokens' last byte in the vocabulary it was compiled on (its sentinels' first)


def split_tokens(
    table: bytes, offsets: npt.NDArray[np.int64], lengths: npt.NDArray[np.int32]
) -> tuple[bytes | None, ...]:
    """Each token's bytes (None for a special token) from :meth:`Vocabulary.byte_table`'s
    parts: in C where the extension is built (5 ms for Qwen's 151,665 tokens against 30 ms),
    else by the Python expression the tests compare it with."""
    native = kernels.KERNELS
    if native is not None:
        found: tuple[bytes | None, ...] = native.split_tokens(table, np.ascontiguousarray(offsets), lengths)
        return found
    ends = offsets + np.maximum(lengths, 0)
    return tuple(
        None if length < 0 else table[start:end]
        for length, start, end in zip(lengths.tolist(), offsets.tolist(), ends.tolist(), strict=True)
    )


XGRAMMAR_COMPILE_THREADS = 8  # xgrammar's GrammarCompiler default


def compile_threads() -> int:
    """Threads for xgrammar's compiles: its default (8), but no more than two per CPU this
    process may run on. Eight on 2 CPUs contend: vLLM's schema of 50 tools 34 ms against 30-32
    with 2 or 4 threads; a second thread per CPU keeps it busy where a compile waits on
    xgrammar's caches (a new schema of 50 tools after others: 2 threads 23.6 ms, 4 20.7, 8 19.9;
    a function's arguments 1.2 ms with 2 or 4, 1.4 with 8)."""
    usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    return min(XGRAMMAR_COMPILE_THREADS, 2 * len(usable))


class VocabularySupport:
    """What every mixed schema of one vocabulary shares: xgrammar's tokenizer info
    (the real tokens, then one ``p + 0xFF`` token per structural prefix ``p``), the
    tokens' effect on the JSON lexer, and the token pieces."""

    def __init__(self, vocab: Vocabulary) -> None:
        import xgrammar

        self.vocab = vocab
        lengths, offsets, table = vocab.byte_table()
        offsets = offsets[: len(lengths)]  # (the table has one offset more: the end)
        self.tokens: tuple[bytes | None, ...] = split_tokens(table, offsets, lengths)  # (the C steps share it)
        self.width = bitmask_width(vocab.vocab_size)
        # Real tokens holding 0xFF (a sentinel's lead byte, never in UTF-8 text) or raw
        # control bytes where strict JSON has none are refused by the lexer tables.
        self.lexical = Lexical.of(vocab, self.width)
        # the structure before each place in a token where a value may start
        ids, starts = value_starts(table, offsets, lengths, VALUE_FIRST)
        inner = starts > 0
        prefixes = sorted(
            ({b""} if not inner.all() else set())
            | {table[o : o + j] for o, j in zip(offsets[ids[inner]].tolist(), starts[inner].tolist(), strict=True)}
        )
        self.prefixes = prefixes
        self.prefix_ids = {p: i for i, p in enumerate(prefixes)}
        # The extra tokens go in the model's padding ids when they fit (then xgrammar
        # fills the caller's row directly), else after the word-aligned real ids.
        self.inline = vocab.vocab_size - len(self.tokens) >= len(prefixes)
        self.first_pseudo = len(self.tokens) if self.inline else 32 * self.width
        self.xgr_width = bitmask_width(vocab.vocab_size if self.inline else self.first_pseudo + len(prefixes))
        self.pseudo_words = (self.first_pseudo >> 5, (self.first_pseudo + len(prefixes) + 31) >> 5)
        keep = np.zeros(32 * (self.pseudo_words[1] - self.pseudo_words[0]), dtype=bool)
        keep[: self.first_pseudo - 32 * self.pseudo_words[0]] = True
        self.pseudo_keep = np.packbits(keep, bitorder="little").view(np.int32)
        # The grammars none of whose strings admits a raw control character (most: schemas
        # without trie fields whose text says so, structure.plain_strings; structures whose
        # sentinels lead with 0x01) compile from their text through xgrammar's caches, on a
        # vocabulary whose extra tokens are p + 0x01; the others on one with p + 0xFF.
        self.control_info = self._tokenizer_info(CONTROL_SENTINEL_LEAD)
        self.schema_compiler = xgrammar.GrammarCompiler(
            self.control_info, max_threads=compile_threads(), cache_limit_bytes=XGRAMMAR_CACHE_BYTES
        )
        self._pieces: BoundedLRU[tuple[bytes, bytes], Pieces] = BoundedLRU(8)  # a handful of byte sets in practice
        self._skeletons: BoundedLRU[Hashable, Skeleton] = BoundedLRU(SKELETON_CACHE_BYTES)
        self._plain_tables: dict[bool, Any] = {}  # the step tables of the schemas without trie fields
        self._lock = threading.Lock()

    def _tokenizer_info(self, lead: int) -> Any:
        """xgrammar's tokenizer info: the real tokens, then ``p + lead`` per structural prefix."""
        import xgrammar

        encoded = [data or b"" for data in self.tokens]
        encoded += [b""] * (self.first_pseudo - len(encoded))
        encoded += [p + bytes([lead]) for p in self.prefixes]
        encoded += [b""] * (self.vocab.vocab_size - len(encoded) if self.inline else 0)
        return xgrammar.TokenizerInfo(
            encoded, xgrammar.VocabType.RAW, vocab_size=len(encoded), stop_token_ids=list(self.vocab.eos_token_ids)
        )

    @cached_property
    def info(self) -> Any:
        """The tokenizer info whose extra tokens are ``p + 0xFF``: of the grammars whose strings
        may admit a raw control character (built on first use: 63 ms, 12 MB for Qwen)."""
        return self._tokenizer_info(SENTINEL_LEAD)

    @cached_property
    def grammar_compiler(self) -> Any:
        """xgrammar's compiler of the structures with 0xFF sentinels: parsed grammars with raw
        bytes, uncached (:data:`XGRAMMAR_CACHE_BYTES`)."""
        import xgrammar

        return xgrammar.GrammarCompiler(self.info, max_threads=compile_threads(), cache_enabled=False)

    @cached_property
    def loose_compiler(self) -> Any:
        """xgrammar's compiler of the schemas without trie fields whose strings may admit a raw
        control character, from their text, with its caches (as :attr:`schema_compiler`)."""
        import xgrammar

        return xgrammar.GrammarCompiler(
            self.info, max_threads=compile_threads(), cache_limit_bytes=XGRAMMAR_CACHE_BYTES
        )

    def tokenizer_info(self, lead: int) -> Any:
        """The tokenizer info whose extra tokens are ``p + lead``."""
        return self.info if lead == SENTINEL_LEAD else self.control_info

    def compile_schema(self, text: str, options: dict[str, Any], plain: bool) -> tuple[Any, int]:
        """xgrammar's ``compile_json_schema`` of ``text`` (a schema without trie fields), and the
        lead of the extra tokens of the vocabulary it was compiled on: ``p + 0x01`` where ``plain``
        (:func:`~.structure.plain_strings`: no string may hold a raw control, so no text of the
        language holds that byte), else ``p + 0xFF``; both through xgrammar's caches."""
        if plain:
            return self.schema_compiler.compile_json_schema(text, **options), CONTROL_SENTINEL_LEAD
        return self.loose_compiler.compile_json_schema(text, **options), SENTINEL_LEAD

    def compile_structure(self, ebnf: str, sentinels: dict[str, bytes], lead: int) -> Any:
        """xgrammar's compiled grammar of ``ebnf`` with each placeholder made its field's
        sentinel (``sentinels``, all beginning with ``lead``): with a control lead from the text
        :func:`~.structure.sentinel_ebnf` writes, through xgrammar's caches; with 0xFF from the
        parsed grammar :func:`~.structure.structure_grammar` writes, uncached."""
        if lead == SENTINEL_LEAD:
            return self.grammar_compiler.compile_grammar(structure_grammar(ebnf, sentinels))
        text = sentinel_ebnf(ebnf, sentinels)
        if text is None:  # pragma: no cover - a change in how xgrammar prints a const
            raise SchemaError(
                "cannot mark the enum fields in xgrammar's grammar text (its printing changed?)", path="$"
            )
        return self.schema_compiler.compile_grammar(text)

    @cached_property
    def jump_tables(self) -> JumpTables:
        """What :meth:`SchemaMatcher.find_jump_forward_string` probes with (built on first use)."""
        lengths, offsets, data = self.vocab.byte_table()
        ids = np.flatnonzero(lengths > 0)
        first = np.frombuffer(data, dtype=np.uint8)[offsets[ids]] if len(ids) else np.zeros(0, np.uint8)
        first_byte = np.full(self.vocab.vocab_size, -1, dtype=np.int16)
        first_byte[ids] = first
        starting = np.zeros((256, self.width), dtype=np.int32)
        flat = starting.reshape(-1).view(np.uint32)
        np.bitwise_or.at(
            flat, first.astype(np.int64) * self.width + (ids >> 5), np.uint32(1) << (ids & 31).astype(np.uint32)
        )
        single = np.full(256, -1, dtype=np.int64)
        ones = ids[lengths[ids] == 1][::-1]  # (the smallest id written last)
        single[first[lengths[ids] == 1][::-1]] = ones
        return JumpTables(first_byte, starting, single)

    @cached_property
    def token_ids(self) -> dict[bytes, int]:
        """The first id of each token's bytes (for the pieces of the first trie field)."""
        # (built from the last token to the first, so that the first id of equal bytes stays)
        ids = dict(zip(reversed(self.tokens), range(len(self.tokens) - 1, -1, -1), strict=True))
        ids.pop(None, None)
        ids.pop(b"", None)
        return cast(dict[bytes, int], ids)

    @cached_property
    def lex_tables(self) -> Any:
        """The vocabulary's part of every schema's :meth:`step_tables` (``_native.LexTables``:
        the tokens, the lexer's tables, the extra tokens' words), or None without the C
        extension."""
        native = kernels.KERNELS
        if native is None:
            return None
        eos = np.zeros(self.vocab.vocab_size, dtype=np.uint8)
        eos[list(self.vocab.eos_token_ids)] = 1
        lo, hi = self.pseudo_words
        keep = np.concatenate([self.lexical.string_keep, self.lexical.utf8_keep])  # the two sets of rows
        rows, words = np.nonzero(keep != -1)  # the words a keep row changes, by row
        return native.LexTables(
            tokens=self.tokens,
            after=b"".join(self.lexical.after),
            keep=keep,
            eos=eos,
            pseudo_keep=np.ascontiguousarray(self.pseudo_keep),
            sparse_offsets=np.searchsorted(rows, np.arange(len(keep) + 1)).astype(np.int64),
            sparse_words=words.astype(np.int32),
            sparse_masks=keep[rows, words],
            vocab_size=self.vocab.vocab_size,
            xgr_width=self.xgr_width,
            pseudo_lo=lo,
            pseudo_hi=hi,
            inline_pseudo=self.inline,
        )

    def step_tables(
        self,
        crossing: frozenset[int],
        fields: tuple[tuple[Any, ...], ...],
        plain_exits: bool,
        controls: bool,
        starts_first: bytes,
        entries: tuple[tuple[tuple[Any, ...], ...], ...] | None,
    ) -> Any:
        """What the C steps of a schema read (``_native.StepTables``: :attr:`lex_tables`;
        ``crossing``, the tokens that may enter one of its fields; per field, its trie's kernel,
        flags by node and :func:`~.fields.exit_tables`; ``plain_exits``: a value's end resumes
        the structure on the same matcher; ``controls``: its grammar may admit a raw control
        character inside a string, :func:`~.structure.controls_in_strings`; ``starts_first``:
        the bytes any of its values starts with; ``entries``: :func:`~.fields.entry_tables`,
        one per structural prefix, or None: a fill where a field may be entered is the
        reference's), or None without the C extension. Shared by the schemas
        without trie fields that agree on ``controls``."""
        native = kernels.KERNELS
        if native is None or not handles_usable():
            return None
        if crossing or fields:  # (fields may be given empty: a field without a kernel)
            flags = np.zeros(len(self.tokens), dtype=np.uint8)
            flags[np.fromiter(crossing, dtype=np.int64, count=len(crossing))] = 1
            entering = {} if entries is None else {"entries": entries, "first_pseudo": self.first_pseudo}
            return native.StepTables(
                lex=self.lex_tables,
                crossing=flags,
                fields=fields,
                plain_exits=plain_exits,
                controls_in_strings=controls,
                starts_first=starts_first,
                **entering,
            )
        with self._lock:
            found = self._plain_tables.get(controls)
        if found is None:
            built = native.StepTables(
                lex=self.lex_tables,
                crossing=np.zeros(len(self.tokens), np.uint8),
                fields=(),
                controls_in_strings=controls,
            )
            with self._lock:
                found = self._plain_tables.setdefault(controls, built)
        return found

    def skeleton(self, key: Hashable) -> Skeleton | None:
        """The structure compiled earlier for a schema of this skeleton, if kept."""
        with self._lock:
            return self._skeletons.get(key)

    def forget_skeletons(self) -> None:
        """Forget the structures compiled so far, and xgrammar's caches (its rules' masks)."""
        with self._lock:
            self._skeletons.clear()
            self.schema_compiler.clear_cache()
            if "loose_compiler" in self.__dict__:  # (built on first use)
                self.loose_compiler.clear_cache()

    def keep_skeleton(self, key: Hashable, compiled: Skeleton) -> Skeleton:
        """Keep ``compiled`` for later schemas of the same skeleton (by its grammar's size);
        the one kept first wins, so concurrent compiles share one grammar."""
        size = int(compiled.grammar.memory_size_bytes) + 2 * len(compiled.ebnf)
        with self._lock:
            return self._skeletons.setdefault(key, compiled, size)

    def pieces(self, first: bytes, last: bytes) -> Pieces:
        key = (first, last)
        with self._lock:
            found = self._pieces.get(key)
        if found is not None:
            return found
        built = Pieces(self, first, last)
        with self._lock:
            return self._pieces.setdefault(key, built)


@dataclass(frozen=True)
class JumpTables:
    """A vocabulary's tables for finding forced bytes with masks: each token's first byte (-1:
    none), for each byte the bitmask row of the tokens that begin with it (256 rows: 4.8 MB
    for a 151K vocabulary), and each byte's single-byte token (-1: none)."""

    first_byte: npt.NDArray[np.int16]
    starting: npt.NDArray[np.int32]
    single: npt.NDArray[np.int64]


_SUPPORT: BoundedLRU[str, VocabularySupport] = BoundedLRU(4)  # by vocabulary fingerprint
_SUPPORT_LOCK = threading.Lock()


def prepare_schemas(vocab: Vocabulary) -> None:
    """Build now what every schema of ``vocab`` shares (xgrammar's tokenizer info with the extra
    tokens, the JSON lexer's tables: 90 ms for Qwen's 151K, 60 of them xgrammar's tokenizer
    info) and the token pieces of enums of strings, the most common trie field (40 ms), so
    that the first schema a server compiles does not pay for them inside an engine step.
    Needs xgrammar."""
    require_xgrammar()
    vocabulary_support(vocab).pieces(b'"', b'"')


def vocabulary_support(vocab: Vocabulary) -> VocabularySupport:
    with _SUPPORT_LOCK:
        found = _SUPPORT.get(vocab.fingerprint)
    if found is None:
        built = VocabularySupport(vocab)  # outside the lock: it takes a while
        with _SUPPORT_LOCK:
            found = _SUPPORT.setdefault(vocab.fingerprint, built)
    return found


def clear_structure_cache() -> None:
    """Forget the structures compiled so far (every vocabulary's) and xgrammar's caches of its
    rules' masks, so that the next compile of each schema builds its grammar again as in a new
    process: for benchmarks of a first compile."""
    with _SUPPORT_LOCK:
        supports = [_SUPPORT.get(key) for key in list(_SUPPORT)]
    for support in supports:
        if support is not None:
            support.forget_skeletons()


@cache
def handles_usable() -> bool:
    """Whether the installed xgrammar's matchers have the handle the C steps call (``_handle``
    with ``accept_token(token, debug_print)``, ``fill_next_token_bitmask(bitmask, row,
    debug_print)``, and the batch matcher's ``batch_fill_next_token_bitmask(handles, bitmask,
    rows, debug_print)``; ``fork()``, ``accept_string(data, debug_print)`` and ``rollback(n)``
    for the probes at a value's end): xgrammar's private interface, checked once per process
    on a tiny grammar. Without it every step is the Python reference's, which uses the public one."""
    import xgrammar

    try:
        info = xgrammar.TokenizerInfo([b"a", b"b"], xgrammar.VocabType.RAW, vocab_size=2, stop_token_ids=[])
        grammar = xgrammar.GrammarCompiler(info, cache_enabled=False).compile_grammar('root ::= "a" "b"')
        handle: Any = xgrammar.GrammarMatcher(grammar)._handle
        batcher: Any = xgrammar.BatchGrammarMatcher()._handle
        row = np.zeros((1, 1), dtype=np.int32)
        batcher.batch_fill_next_token_bitmask([handle], row, [0], False)
        handle.fill_next_token_bitmask(row, 0, False)
        allowed = int(row[0, 0]) & 3  # (xgrammar sets the bits past the vocabulary)
        forked = handle.fork()  # (and the calls of the exits' probes: fork, accept_string, rollback)
        strings = forked.accept_string(b"a", False) is True and forked.accept_string(b"a", False) is False
        forked.rollback(1)
        strings = strings and forked.accept_string(b"ab", False) is True
        return (
            strings
            and allowed == 1
            and handle.accept_token(0, False) is True
            and handle.accept_token(0, False) is False
        )
    except Exception:  # any change there: the reference's public calls
        return False


@cache  # once per process when it passes (a failure raises again at the next call)
def require_xgrammar() -> None:
    try:
        import xgrammar  # noqa: F401
    except ImportError:
        raise ImportError(
            "JSON schemas need xgrammar for their structure: pip install 'triemask[schema]' "
            "(install torch==2.13.0 first on CPU-only machines)"
        ) from None
    found = version("xgrammar")
    if tuple(int(x) for x in re.findall(r"\d+", found)[:3]) < (0, 2, 1):  # earlier ones over-accept alternations
        raise ImportError(f"triemask needs xgrammar >= 0.2.1 (pip install -U xgrammar), found {found}")
    check_entry_unforgeable()
