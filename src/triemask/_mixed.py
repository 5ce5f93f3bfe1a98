"""Mixed schemas: enum fields in tries, the JSON structure in xgrammar.

Design (docs/design.md, "Mixed schemas"). Each enum site of the schema is replaced
by a const placeholder; xgrammar builds the structural grammar, and in xgrammar's own
expression arrays the placeholder's literal is swapped for a *sentinel*: byte ``0xFF``
followed by bytes naming the field. ``0xFF`` is not UTF-8: xgrammar's character classes
and regexes match only UTF-8 (a free string's ``[^"\\\r\n]`` included), and its EBNF
literals are code points spelled in UTF-8, so no text the structure's language holds can
contain it and the sentinel is accepted exactly where a field's value goes
(:func:`_check_entry_unforgeable` checks the installed xgrammar once per process).

A decoding state is a small set of *configurations*, usually one:

* ``STRUCT``: an xgrammar matcher in the structural grammar;
* ``ENUM(k, node)``: a node of trie ``k``, and the xgrammar matcher just past
  sentinel ``k`` (it does not move while the value is spelled, and is where the
  structure resumes when the value ends).

Matchers are never modified once in a configuration (every step forks; probes
roll back), so configurations, rollback history and copies share them freely.

A token may span structure and enum bytes (``": "get``, ``_user",``, ``"a", "b``).
It is cut at the places a value can start (a byte a value of the site starts with,
after structural bytes ending in ``:``, ``,``, ``[`` or whitespace) and end (a value's
last byte followed by ``,``, ``}``, ``]`` or whitespace). The pieces (the part after
a start, the part before an end, the part between) are matched against each trie
at compile time, by the same linear pass as whole tokens, so at run time:

* the mask of ``STRUCT`` is xgrammar's, plus the tokens entering an enum after a
  structural prefix ``p``. xgrammar's vocabulary carries one extra token ``p + 0xFF``
  per such prefix, so the same mask fill says which prefixes an enum can follow;
  those are confirmed per site with ``accept_string(p + sentinel)``;
* the mask of ``ENUM`` is the trie's, plus the tokens that complete the value and go
  on (checked with the structural grammar after the sentinel);
* when a configuration is ambiguous (a union of an enum and a free string), every
  reading is kept, so the masks are those of the whole schema's language.

Outputs are strict JSON (RFC 8259) in UTF-8: where xgrammar's language is looser (raw
control characters in length-bounded strings, the UTF-8 bytes of surrogates), a JSON lexer
state kept per output removes the tokens that would break it (:class:`_Lexical`).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import threading
import time
from bisect import bisect_left
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cache, cached_property
from importlib.metadata import version
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from . import _storage
from ._automaton import DEAD, TrieAutomaton, restore_parts
from ._bitmask import as_bitmask_array, bitmask_width
from ._compile import compile_pattern_with_pseudo_tokens, compile_with_pseudo_tokens
from ._errors import (
    ArgumentTypeError,
    AutomatonFileError,
    IncompatibleValueError,
    SchemaError,
    StateError,
    TriemaskError,
    integer,
)
from ._regex import unanchored
from ._schema import dispatch, json_texts, load_schema
from ._token_index import TokenIndex
from ._vocabulary import Vocabulary

if TYPE_CHECKING:
    from ._compile import Compiler

__all__ = [
    "DEFAULT_MIN_ENUM_VALUES",
    "CompiledSchema",
    "Configuration",
    "SchemaMatcher",
    "allowed_token_rows",
    "configurations_after",
    "fill_next_token_bitmasks",
    "prepare_schemas",
    "register_schema_kind",
    "stored_field_automaton",
]

DEFAULT_MIN_ENUM_VALUES = 256
"""Enums with at least this many values go to a trie. Measured (``python -m benchmarks
schemas --threshold``, docs/schemas.md): from about 128-256 values on the trie compiles faster
than xgrammar's alternation, 3x faster at 1,000 and 25-100x beyond 10,000; per step xgrammar
is faster up to a few thousand values, so schemas reused by many requests may want more."""

_FOLLOW = b",}] \t\n\r"  # what can follow a JSON value
_VALUE_FIRST = b'"-0123456789tfn'  # what a JSON scalar can start with
_BEFORE_VALUE = re.compile(rb"(?:.*[:,\[])?[ \t\n\r]*\Z", re.S)  # structure a value can follow
_SENTINEL_LEAD = 0xFF  # never in UTF-8, so in no text of the structure's language
_SENTINEL_DIGITS = bytes(range(0x10, 0x20))
_STRUCT = -1


def _sentinel(k: int, width: int) -> bytes:
    return bytes([_SENTINEL_LEAD, *(_SENTINEL_DIGITS[(k >> (4 * i)) & 15] for i in reversed(range(width)))])


def _starts(token: bytes, first: bytes) -> list[int]:
    """Offsets in ``token`` where a value starting with one of ``first`` may begin."""
    return [j for j, c in enumerate(token) if c in first and (j == 0 or _BEFORE_VALUE.match(token, 0, j))]


def _ends(token: bytes, last: bytes) -> list[int]:
    """Offsets ``i`` in ``token`` where a value ending with one of ``last`` may stop."""
    return [i for i in range(1, len(token)) if token[i] in _FOLLOW and token[i - 1] in last]


# --------------------------------------------------------------------------- strict JSON

# The JSON lexer of an output, a byte automaton: outside strings, inside one (between
# characters), after a backslash in one, and inside a multi-byte UTF-8 character (what the
# next bytes may be: RFC 3629's table, so no overlong form, no surrogate, nothing past
# U+10FFFF). _REFUSED: the bytes cannot continue strict JSON (RFC 8259) in UTF-8.
_OUT, _IN, _ESCAPE, _TAIL1, _TAIL2, _TAIL3, _AFTER_E0, _AFTER_ED, _AFTER_F0, _AFTER_F4, _REFUSED = range(11)
_LEXER_STATES = range(_REFUSED)
_JSON_WHITESPACE = b" \t\n\r"


def _lexer_table() -> list[bytes]:
    """``table[state][byte]``: the lexer state after ``byte``."""
    table = [bytearray([_REFUSED]) * 256 for _ in _LEXER_STATES]
    for c in range(0x20, 0x80):  # printable ASCII: outside strings and in them
        table[_OUT][c] = _IN if c == 0x22 else _OUT
        table[_IN][c] = {0x22: _OUT, 0x5C: _ESCAPE}.get(c, _IN)
        table[_ESCAPE][c] = _IN  # (which escapes are JSON is the grammar's business)
    for c in _JSON_WHITESPACE:
        table[_OUT][c] = _OUT
    # a character's first byte in a string: how many and which continuation bytes follow
    for lead, state in ((range(0xC2, 0xE0), _TAIL1), (range(0xE1, 0xF0), _TAIL2), (range(0xF1, 0xF4), _TAIL3)):
        for c in lead:
            table[_IN][c] = state
    table[_IN][0xE0], table[_IN][0xED] = _AFTER_E0, _AFTER_ED
    table[_IN][0xF0], table[_IN][0xF4] = _AFTER_F0, _AFTER_F4
    for state, low, high, following in (
        (_TAIL1, 0x80, 0xC0, _IN),
        (_TAIL2, 0x80, 0xC0, _TAIL1),
        (_TAIL3, 0x80, 0xC0, _TAIL2),
        (_AFTER_E0, 0xA0, 0xC0, _TAIL1),
        (_AFTER_ED, 0x80, 0xA0, _TAIL1),
        (_AFTER_F0, 0x90, 0xC0, _TAIL2),
        (_AFTER_F4, 0x80, 0x90, _TAIL2),
    ):
        table[state][low:high] = bytes([following]) * (high - low)
    return [bytes(row) for row in table]


_LEXER = _lexer_table()
_PLAIN_TEXT = re.compile(rb"[\x20-\x21\x23-\x5b\x5d-\x7e]*\Z")  # printable ASCII but quote and backslash


def _lex(data: bytes, state: int) -> int:
    """The lexer state after ``data`` from ``state`` (or ``_REFUSED``)."""
    for c in data:
        state = _LEXER[state][c]
        if state == _REFUSED:
            break
    return state


@dataclass(frozen=True)
class _Lexical:
    """Per vocabulary, what each token does to the JSON lexer state of an output: refused
    are the tokens that would put a raw control character or bytes that are not UTF-8
    inside a string (xgrammar's length-bounded strings and its patterns admit some), and
    the sentinel's lead byte 0xFF anywhere."""

    after: tuple[bytes, ...]  # by start state, by token id: the state after it, or _REFUSED
    keep: npt.NDArray[np.int32]  # (start states, width): the bitmask of the tokens not refused
    never: npt.NDArray[np.bool_]  # by token id: refused from every state (no piece of it is needed)

    @classmethod
    def of(cls, tokens: Sequence[bytes | None], width: int) -> _Lexical:
        n = len(tokens)
        after = [bytearray([state]) * n for state in _LEXER_STATES]  # special tokens (EOS) move nothing
        for t, data in enumerate(tokens):
            if not data:
                continue
            if _PLAIN_TEXT.match(data):  # most tokens: no state but a character's middle changes
                after[_ESCAPE][t] = _IN
                for state in range(_TAIL1, _REFUSED):
                    after[state][t] = _REFUSED
            else:
                for state in _LEXER_STATES:
                    after[state][t] = _lex(data, state)
        refused = np.stack([np.frombuffer(a, dtype=np.uint8) for a in after]) == _REFUSED
        keep = np.full((len(_LEXER_STATES), width), -1, dtype=np.int32)
        for state in _LEXER_STATES:
            ids = np.flatnonzero(refused[state])
            np.bitwise_and.at(
                keep[state].view(np.uint32), ids >> 5, ~np.left_shift(np.uint32(1), (ids & 31).astype(np.uint32))
            )
        return cls(tuple(bytes(a) for a in after), keep, refused.all(axis=0))


# Free text of every kind xgrammar builds for JSON (strings plain, length-bounded, with a
# pattern, a format; free property names), and prefixes that lead into each: none may
# accept the sentinel's lead byte.
_FREE_TEXT = {
    "anyOf": [
        {"type": "string"},
        {"type": "string", "maxLength": 8},
        {"type": "string", "minLength": 1, "maxLength": 8},
        {"type": "string", "pattern": "[^a]{0,8}"},
        {"type": "string", "pattern": ".{0,8}"},
        {"type": "string", "pattern": "[\\s\\S]{0,8}"},
        {"type": "string", "pattern": "^[\\x00-\\uffff]+$"},
        {"type": "string", "format": "email"},
        {"type": "string", "format": "uri"},
        {"type": "string", "format": "date-time"},
        {"type": "object", "additionalProperties": {"type": "string", "maxLength": 4}},
    ]
}
_INTO_FREE_TEXT = (b'"', b'"b', b'"a@', b'{"', b'{"k": "')


@cache
def _check_entry_unforgeable() -> None:
    """Refuse an xgrammar whose free text can hold byte 0xFF: a field's entry (the sentinel)
    would then be forgeable inside a string. Once per process, on 256 one-byte tokens."""
    import xgrammar

    table = [bytes([b]) for b in range(256)]
    compiler = xgrammar.GrammarCompiler(
        xgrammar.TokenizerInfo(table, xgrammar.VocabType.RAW, vocab_size=256, stop_token_ids=[]),
        cache_enabled=False,
    )
    start = xgrammar.GrammarMatcher(compiler.compile_json_schema(json.dumps(_FREE_TEXT), any_whitespace=False))
    mask = np.zeros((1, 8), dtype=np.int32)
    for prefix in _INTO_FREE_TEXT:
        matcher = start.fork()
        if not matcher.accept_string(prefix):  # pragma: no cover - a change in xgrammar's JSON
            raise ImportError(f"triemask cannot check xgrammar's free text: it refuses {prefix!r}")
        matcher.fill_next_token_bitmask(mask)
        in_mask = (int(mask[0, _SENTINEL_LEAD >> 5]) >> (_SENTINEL_LEAD & 31)) & 1
        if in_mask or matcher.fork().accept_string(bytes([_SENTINEL_LEAD])):
            raise ImportError(
                f"the installed xgrammar ({version('xgrammar')}) lets free text (after {prefix!r}) hold byte "
                f"0x{_SENTINEL_LEAD:02X}, with which triemask marks where a field's value may start: its schemas "
                "would accept invalid JSON. Install an xgrammar that keeps strings UTF-8 (0.2.x)."
            )


def _sentinels(fields: Iterable[_Field]) -> dict[str, bytes]:
    return {placeholder: f.sentinel for f in fields for placeholder in f.placeholders}


def _structure_grammar(ebnf: str, sentinels: dict[str, bytes]) -> Any:
    """xgrammar's grammar of ``ebnf`` with each placeholder's literal (its JSON text, a key
    of ``sentinels``) made that field's sentinel.

    xgrammar's EBNF spells code points, so a byte that is not UTF-8 can only be written into
    the parsed grammar: its serialised expressions, where a byte string is
    ``[0, length, byte...]`` (the same in every xgrammar since 0.2.1). Placeholders hold a
    random nonce, so no other literal equals one; each must be found.
    """
    import xgrammar

    data = json.loads(xgrammar.Grammar.from_ebnf(ebnf).serialize_json())
    exprs, starts = data["grammar_expr_data"], data["grammar_expr_indptr"]
    wanted = {tuple(json.dumps(p).encode()): sentinel for p, sentinel in sentinels.items()}
    found = set()
    rewritten: list[int] = []
    new_starts: list[int] = []
    for start, end in zip(starts, [*starts[1:], len(exprs)], strict=True):
        expr = exprs[start:end]
        sentinel = wanted.get(tuple(expr[2:])) if expr[0] == 0 and expr[1] == len(expr) - 2 else None
        if sentinel is not None:
            expr = [0, len(sentinel), *sentinel]
            found.add(sentinel)
        new_starts.append(len(rewritten))
        rewritten += expr
    if len(found) != len(set(sentinels.values())):  # pragma: no cover - a change in xgrammar's grammar layout
        raise SchemaError("cannot mark the enum fields in xgrammar's grammar (its layout changed?)", path="$")
    data["grammar_expr_data"], data["grammar_expr_indptr"] = rewritten, new_starts
    return xgrammar.Grammar.deserialize_json(json.dumps(data))


# --------------------------------------------------------------------------- per vocabulary


class _Pieces:
    """Pieces of tokens around value boundaries, indexed for matching against tries.

    Three kinds, per token: a *tail* (from a possible value start to the token's end),
    a *head* (from the token's start to a possible value end) and a *middle* (a whole
    value inside the token, from a start to an end). Heads are kept per piece with
    what follows them in the token (the *rest*), since every trie node a head ends a
    value from shares them.
    """

    def __init__(self, support: _VocabularySupport, first: bytes, last: bytes) -> None:
        ids: dict[bytes, int] = {}
        self.enters: list[tuple[int, int, int, int]] = []  # (piece, token, start, end): tails and middles
        heads: list[tuple[int, int, int]] = []  # (piece, token, end)
        never = support.lexical.never.tolist()
        for t, data in enumerate(support.tokens):
            if not data or never[t]:
                continue
            starts = _starts(data, first)
            ends = _ends(data, last)
            for j in starts:
                self.enters.append((ids.setdefault(data[j:], len(ids)), t, j, len(data)))
                self.enters.extend((ids.setdefault(data[j:i], len(ids)), t, j, i) for i in ends if i > j)
            heads.extend((ids.setdefault(data[:i], len(ids)), t, i) for i in ends)
        self.pieces: list[bytes] = list(ids)
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
        # token of that prefix says whether a value may start there): see _fill_exits.
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
    starts = _starts(data, _VALUE_FIRST)
    if not starts:
        return -2
    if len(starts) == 1 and data[: starts[0]] in prefix_ids:
        return prefix_ids[data[: starts[0]]]
    return -1


class _VocabularySupport:
    """What every mixed schema of one vocabulary shares: xgrammar's tokenizer info
    (the real tokens, then one ``p + 0xFF`` token per structural prefix ``p``), the
    tokens' effect on the JSON lexer, and the token pieces."""

    def __init__(self, vocab: Vocabulary) -> None:
        import xgrammar

        self.vocab = vocab
        self.tokens: list[bytes | None] = [vocab.token_bytes(i) for i in range(len(vocab))]
        self.width = bitmask_width(vocab.vocab_size)
        # Real tokens holding 0xFF (a sentinel's lead byte, never in UTF-8 text) or raw
        # control bytes where strict JSON has none are refused by the lexer tables.
        self.lexical = _Lexical.of(self.tokens, self.width)
        prefixes = sorted({data[:j] for data in self.tokens if data for j in _starts(data, _VALUE_FIRST)})
        self.prefixes = prefixes
        self.prefix_ids = {p: i for i, p in enumerate(prefixes)}
        # The extra tokens go in the model's padding ids when they fit (then xgrammar
        # fills the caller's row directly), else after the word-aligned real ids.
        self.inline = vocab.vocab_size - len(self.tokens) >= len(prefixes)
        self.first_pseudo = len(self.tokens) if self.inline else 32 * self.width
        encoded = [data or b"" for data in self.tokens]
        encoded += [b""] * (self.first_pseudo - len(encoded))
        encoded += [p + bytes([_SENTINEL_LEAD]) for p in prefixes]
        if self.inline:
            encoded += [b""] * (vocab.vocab_size - len(encoded))
        self.xgr_width = bitmask_width(len(encoded))
        self.pseudo_words = (self.first_pseudo >> 5, (self.first_pseudo + len(prefixes) + 31) >> 5)
        keep = np.zeros(32 * (self.pseudo_words[1] - self.pseudo_words[0]), dtype=bool)
        keep[: self.first_pseudo - 32 * self.pseudo_words[0]] = True
        self.pseudo_keep = np.packbits(keep, bitorder="little").view(np.int32)
        self.token_ids: dict[bytes, int] = {}
        for t, data in enumerate(self.tokens):
            if data:
                self.token_ids.setdefault(data, t)
        self.info = xgrammar.TokenizerInfo(
            encoded, xgrammar.VocabType.RAW, vocab_size=len(encoded), stop_token_ids=list(vocab.eos_token_ids)
        )
        self.grammar_compiler = xgrammar.GrammarCompiler(self.info, cache_enabled=False)
        self._pieces: OrderedDict[tuple[bytes, bytes], _Pieces] = OrderedDict()
        self._lock = threading.Lock()

    def pieces(self, first: bytes, last: bytes) -> _Pieces:
        key = (first, last)
        with self._lock:
            if key in self._pieces:
                self._pieces.move_to_end(key)
                return self._pieces[key]
        built = _Pieces(self, first, last)
        with self._lock:
            self._pieces[key] = built
            while len(self._pieces) > 8:  # a handful of byte-set combinations in practice
                self._pieces.popitem(last=False)
        return built


_SUPPORT: dict[str, _VocabularySupport] = {}
_SUPPORT_LOCK = threading.Lock()


def prepare_schemas(vocab: Vocabulary) -> None:
    """Build now what every schema of ``vocab`` shares (xgrammar's tokenizer info with the extra
    tokens, the JSON lexer's tables; 0.7 s for a 49K vocabulary, 2.2 s for Qwen's 151K), so the
    first schema a server compiles does not pay for it inside an engine step. Needs xgrammar."""
    _require_xgrammar()
    _support(vocab)


def _support(vocab: Vocabulary) -> _VocabularySupport:
    with _SUPPORT_LOCK:
        found = _SUPPORT.get(vocab.fingerprint)
    if found is None:
        found = _VocabularySupport(vocab)
        with _SUPPORT_LOCK:
            _SUPPORT[vocab.fingerprint] = found
            while len(_SUPPORT) > 4:
                del _SUPPORT[next(iter(_SUPPORT))]
    return found


def _require_xgrammar() -> None:
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
    _check_entry_unforgeable()


# --------------------------------------------------------------------------- enum fields


@dataclass(frozen=True)
class _Field:
    """One trie of a mixed schema and the tables that connect it to the structure."""

    paths: tuple[str, ...]
    placeholders: tuple[str, ...]  # by path: the const standing for the field in the structure's EBNF
    automaton: TrieAutomaton
    sentinel: bytes
    first: bytes
    last: bytes
    pieces: _Pieces
    accepting: npt.NDArray[np.bool_]  # by node
    leaves: npt.NDArray[np.bool_]  # accepting nodes nothing extends: the value is over
    tails: dict[bytes, int]  # piece after a value start -> trie node it reaches from the root
    middles: dict[bytes, int]  # a whole value's text piece -> its accepting node
    crossing: frozenset[int]  # tokens that can enter a value of the field (a tail or a middle walks the trie)
    enter_masks: dict[int, tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]]  # prefix id -> words, bits
    middle_by_prefix: dict[int, list[tuple[int, int, int, int]]]  # prefix id -> (token, start, end, node)
    # (node, head piece, accepting node): from `node`, the head piece ends a value; sorted by node
    exit_nodes: npt.NDArray[np.int32]
    exit_pieces: npt.NDArray[np.int32]
    exit_values: npt.NDArray[np.int32]
    compile_seconds: float

    @property
    def exit_nodes_view(self) -> memoryview:
        return self.exit_nodes.data


def _compile_field(
    compiler: Compiler,
    support: _VocabularySupport,
    site_paths: tuple[str, ...],
    values: tuple[Any, ...],
    pattern: str | None = None,
) -> _Field:
    started = time.perf_counter()
    path = site_paths[0]
    automaton: TrieAutomaton
    if pattern is not None:  # a finite string field: the pattern's automaton, in quotes
        texts: list[bytes] = []
        first = last = b'"'
        pieces = support.pieces(first, last)
        try:
            automaton, (piece_ids, dests, offsets) = compile_pattern_with_pseudo_tokens(
                compiler, '"(?:' + unanchored(pattern) + ')"', pieces.index
            )
        except IncompatibleValueError as exc:
            raise SchemaError(f"{path}: {exc}", path=path) from None
    else:
        texts = json_texts(values, path)
        first = bytes(sorted({t[0] for t in texts}))
        last = bytes(sorted({t[-1] for t in texts}))
        pieces = support.pieces(first, last)
        try:
            automaton, (piece_ids, dests, offsets) = compile_with_pseudo_tokens(compiler, texts, pieces.index)
        except IncompatibleValueError as exc:
            index = texts.index(exc.value) if isinstance(exc.value, bytes) and exc.value in texts else 0
            raise SchemaError(
                f"{path}[{index}] {values[index]!r:.60} cannot be spelled with this vocabulary's tokens: {exc}",
                path=f"{path}[{index}]",
            ) from None
    accepting_nodes = automaton.accepting_nodes
    n = automaton.num_nodes
    accepting = np.zeros(n + 1, dtype=bool)
    accepting[accepting_nodes] = True
    # a value is a leaf unless another value extends it (sorted: then the next one does;
    # a pattern's text ends with its closing quote, which nothing extends)
    ordered = sorted(texts)
    extended = {a for a, b in pairwise(ordered) if b.startswith(a)}
    leaves = accepting.copy()
    if extended:
        for node in accepting_nodes.tolist():
            if automaton.allowed_token_ids(node).size:
                leaves[node] = False
    tails: dict[bytes, int] = {}
    middles: dict[bytes, int] = {}
    crossing: set[int] = set()
    enter_lists: dict[int, list[int]] = {}
    middle_by_prefix: dict[int, list[tuple[int, int, int, int]]] = {}
    from_root = dict(
        zip(piece_ids[offsets[0] : offsets[1]].tolist(), dests[offsets[0] : offsets[1]].tolist(), strict=True)
    )
    for pid, token, start, end in pieces.enters:
        node = from_root.get(pid)
        if node is None:
            continue
        data = support.tokens[token]
        assert data is not None
        prefix = support.prefix_ids[data[:start]]
        if end == len(data):  # a tail
            tails[pieces.pieces[pid]] = node
            crossing.add(token)
            enter_lists.setdefault(prefix, []).append(token)
        if end < len(data) and accepting[node]:  # a whole value, then more
            middles[pieces.pieces[pid]] = node
            crossing.add(token)
            middle_by_prefix.setdefault(prefix, []).append((token, start, end, node))
    enter_masks = {}
    for prefix, tokens in enter_lists.items():
        ids = np.unique(np.asarray(tokens, dtype=np.int64))
        words, inverse = np.unique(ids >> 5, return_inverse=True)
        bits = np.zeros(len(words), dtype=np.uint32)
        np.bitwise_or.at(bits, inverse, np.left_shift(np.uint32(1), (ids & 31).astype(np.uint32)))
        enter_masks[prefix] = (words, bits.view(np.int32))
    # heads that end a value, from any node
    sources = np.repeat(np.arange(n, dtype=np.int32), np.diff(offsets[: n + 1]))
    ends_value = accepting[dests[: len(sources)]]
    has_heads = np.diff(pieces.head_offsets)[piece_ids[: len(sources)]] > 0
    keep = ends_value & has_heads
    return _Field(
        paths=site_paths,
        placeholders=(),  # set by the schema, which numbers the fields
        automaton=automaton,
        sentinel=b"",
        first=first,
        last=last,
        accepting=accepting,
        leaves=leaves,
        pieces=pieces,
        tails=tails,
        middles=middles,
        crossing=frozenset(crossing),
        enter_masks=enter_masks,
        middle_by_prefix=middle_by_prefix,
        exit_nodes=sources[keep],
        exit_pieces=piece_ids[: len(sources)][keep].astype(np.int32),
        exit_values=dests[: len(sources)][keep].astype(np.int32),
        compile_seconds=time.perf_counter() - started,
    )


def _text_array(text: str) -> npt.NDArray[np.uint8]:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


def _array_text(array: npt.NDArray[Any]) -> str:
    if array.dtype != np.uint8:
        raise TypeError(f"text stored as {array.dtype}, not bytes")
    return array.tobytes().decode("utf-8")


def _packed(items: Iterable[bytes]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    items = list(items)
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum([len(item) for item in items], out=offsets[1:])
    return np.frombuffer(b"".join(items), dtype=np.uint8), offsets


def _unpacked(flat: npt.NDArray[Any], offsets: npt.NDArray[Any]) -> list[bytes]:
    if flat.dtype != np.uint8 or offsets.dtype != np.int64 or len(offsets) < 1 or offsets[0] != 0:
        raise ValueError("packed byte strings of the wrong form")
    if (np.diff(offsets) < 0).any() or offsets[-1] != len(flat):
        raise ValueError("packed byte strings out of order or out of bounds")
    data = flat.tobytes()
    bounds = offsets.tolist()
    return [data[a:b] for a, b in pairwise(bounds)]


def _field_tables(f: _Field) -> dict[str, npt.NDArray[Any]]:
    """The boundary tables of a field as flat arrays (for the file format)."""
    tails, tail_offsets = _packed(f.tails)
    middles, middle_offsets = _packed(f.middles)
    prefixes = sorted(f.enter_masks)
    enter_offsets = np.zeros(len(prefixes) + 1, dtype=np.int64)
    np.cumsum([len(f.enter_masks[p][0]) for p in prefixes], out=enter_offsets[1:])
    middle_entries = [(p, *entry) for p, entries in sorted(f.middle_by_prefix.items()) for entry in entries]
    return {
        "accepting": f.accepting,
        "leaves": f.leaves,
        "tails": tails,
        "tail_offsets": tail_offsets,
        "tail_nodes": np.fromiter(f.tails.values(), dtype=np.int32, count=len(f.tails)),
        "middles": middles,
        "middle_offsets": middle_offsets,
        "middle_nodes": np.fromiter(f.middles.values(), dtype=np.int32, count=len(f.middles)),
        "crossing": np.array(sorted(f.crossing), dtype=np.int32),
        "enter_prefixes": np.array(prefixes, dtype=np.int32),
        "enter_offsets": enter_offsets,
        "enter_words": np.concatenate([f.enter_masks[p][0] for p in prefixes] or [np.zeros(0, np.int64)]),
        "enter_bits": np.concatenate([f.enter_masks[p][1] for p in prefixes] or [np.zeros(0, np.int32)]),
        "middle_entries": np.array(middle_entries, dtype=np.int32).reshape(-1),
        "exit_nodes": f.exit_nodes,
        "exit_pieces": f.exit_pieces,
        "exit_values": f.exit_values,
    }


def stored_field_automaton(stored: _storage.Stored, k: int, vocab: Vocabulary | None = None) -> TrieAutomaton:
    """Enum field ``k``'s automaton in a saved schema, checked as any saved automaton is
    (against ``vocab`` when given; :meth:`CompiledSchema.load` checks the file's fingerprint)."""
    entry = stored.meta["fields"][k]
    prefix = f"f{k}.automaton."
    return restore_parts(
        entry["automaton_kind"],
        entry["automaton_meta"],
        {name.removeprefix(prefix): array for name, array in stored.arrays.items() if name.startswith(prefix)},
        vocab_fingerprint=stored.header["vocab_fingerprint"],
        source=stored.source,
        field=f"f{k}.automaton",
        vocab=vocab,
    )


def _restore_field(stored: _storage.Stored, support: _VocabularySupport, k: int, entry: dict[str, Any]) -> _Field:
    """Field ``k`` of a stored schema, every table checked against its automaton, the
    vocabulary and the token pieces (a checksum-valid but inconsistent file is refused,
    never left to fail in a decoding step)."""
    arrays = stored.arrays

    def table(name: str, dtype: Any) -> npt.NDArray[Any]:
        array = arrays[f"f{k}.{name}"]
        if array.dtype != dtype:
            raise TypeError(f"f{k}.{name} is {array.dtype}, not {np.dtype(dtype)}")
        return array

    def within(name: str, array: npt.NDArray[Any], high: int) -> npt.NDArray[Any]:
        if array.size and not (int(array.min()) >= 0 and int(array.max()) < high):
            raise ValueError(f"field {k}: {name} outside [0, {high})")
        return array

    automaton = stored_field_automaton(stored, k, support.vocab)
    first, last = bytes.fromhex(entry["first"]), bytes.fromhex(entry["last"])
    pieces = support.pieces(first, last)
    if entry["pieces_fingerprint"] != pieces.fingerprint:
        raise AutomatonFileError(
            f"{stored.source} was written by a triemask that cuts tokens into other pieces: compile the schema again",
            field="pieces_fingerprint",
        )
    states = automaton.num_nodes + 1  # node ids, and the one past them that `accepting` also holds
    accepting, leaves = table("accepting", np.bool_), table("leaves", np.bool_)
    if len(accepting) != states or len(leaves) != states:
        raise ValueError(f"field {k}: {len(accepting)} and {len(leaves)} node flags for {states} nodes")
    tails = dict(
        zip(
            _unpacked(table("tails", np.uint8), table("tail_offsets", np.int64)),
            within("tail nodes", table("tail_nodes", np.int32), states).tolist(),
            strict=True,
        )
    )
    middles = dict(
        zip(
            _unpacked(table("middles", np.uint8), table("middle_offsets", np.int64)),
            within("middle nodes", table("middle_nodes", np.int32), states).tolist(),
            strict=True,
        )
    )
    crossing = within("crossing tokens", table("crossing", np.int32), len(support.tokens))
    enter_prefixes = within("prefixes", table("enter_prefixes", np.int32), len(support.prefixes)).tolist()
    enter_offsets = table("enter_offsets", np.int64)
    enter_words = within("mask words", table("enter_words", np.int64), support.width)
    enter_bits = table("enter_bits", np.int32)
    if (
        len(enter_offsets) != len(enter_prefixes) + 1
        or enter_offsets[0] != 0
        or (np.diff(enter_offsets) < 0).any()
        or enter_offsets[-1] != len(enter_words)
        or len(enter_bits) != len(enter_words)
    ):
        raise ValueError(f"field {k}: entry masks out of order or out of bounds")
    bounds = enter_offsets.tolist()
    enter_masks = {
        p: (enter_words[a:b], enter_bits[a:b]) for p, (a, b) in zip(enter_prefixes, pairwise(bounds), strict=True)
    }
    rows = table("middle_entries", np.int32)
    if len(rows) % 5:
        raise ValueError(f"field {k}: middle entries of the wrong length")
    middle_by_prefix: dict[int, list[tuple[int, int, int, int]]] = {}
    for p, token, start, end, node in rows.reshape(-1, 5).tolist():
        data = support.tokens[token] if 0 <= token < len(support.tokens) else None
        if not (0 <= p < len(support.prefixes) and data and 0 <= start < end <= len(data) and 0 <= node < states):
            raise ValueError(f"field {k}: middle entry {(p, token, start, end, node)} outside the vocabulary")
        middle_by_prefix.setdefault(p, []).append((token, start, end, node))
    exit_nodes = within("exit nodes", table("exit_nodes", np.int32), states)
    exit_pieces = within("exit pieces", table("exit_pieces", np.int32), len(pieces.pieces))
    exit_values = within("exit values", table("exit_values", np.int32), states)
    if not len(exit_nodes) == len(exit_pieces) == len(exit_values) or (np.diff(exit_nodes) < 0).any():
        raise ValueError(f"field {k}: exit tables of unequal lengths or out of order")
    sentinel = bytes.fromhex(entry["sentinel"])
    placeholders = tuple(str(p) for p in entry.get("placeholders", ()))
    if not sentinel.startswith(bytes([_SENTINEL_LEAD])) or len(placeholders) != len(entry["paths"]):
        raise AutomatonFileError(
            f"{stored.source} was written by a triemask whose field entries free strings could forge: "
            "compile the schema again",
            field="sentinel",
        )
    return _Field(
        paths=tuple(str(p) for p in entry["paths"]),
        placeholders=placeholders,
        automaton=automaton,
        sentinel=sentinel,
        first=first,
        last=last,
        pieces=pieces,
        accepting=accepting,
        leaves=leaves,
        tails=tails,
        middles=middles,
        crossing=frozenset(crossing.tolist()),
        enter_masks=enter_masks,
        middle_by_prefix=middle_by_prefix,
        exit_nodes=exit_nodes,
        exit_pieces=exit_pieces,
        exit_values=exit_values,
        compile_seconds=float(entry["compile_seconds"]),
    )


# --------------------------------------------------------------------------- compiled schema

# A configuration: (schema, xgrammar matcher, field or _STRUCT, trie node, the output before
# the value, a cache shared by the configurations of one value (None in STRUCT)).
Configuration = tuple["CompiledSchema", Any, int, int, bytes, Any]


def _fingerprint(kind: str, described: Any, file_options: dict[str, Any]) -> str:
    digest = hashlib.blake2b(kind.encode(), digest_size=16)
    digest.update(json.dumps([described, file_options], sort_keys=True).encode())
    return digest.hexdigest()


def _json_separators(separators: Any) -> tuple[str, str] | None:
    """``separators`` as xgrammar takes them, refused unless they are JSON's (a comma, a
    colon, optional whitespace): xgrammar would print others, and the output would not be
    JSON (nor would a value start or end where the token pieces look for it)."""
    if separators is None:
        return None
    if not (isinstance(separators, tuple | list) and len(separators) == 2 and all(type(x) is str for x in separators)):
        raise ArgumentTypeError(f"separators must be a pair of strings (items, keys), got {separators!r:.60}")
    item, key = separators
    if not (re.fullmatch("[ \t\n\r]*,[ \t\n\r]*", item) and re.fullmatch("[ \t\n\r]*:[ \t\n\r]*", key)):
        raise SchemaError(
            f"separators {separators!r:.60} are not JSON's: a ',' between items and a ':' after keys, "
            "each with optional whitespace",
            path="$",
        )
    return (item, key)


class CompiledSchema:
    """A JSON schema compiled for one vocabulary: enum fields as tries, the rest in xgrammar.

    Immutable and shareable across threads and requests; follow one output with
    ``triemask.Matcher(compiled_schema)``. Built by :meth:`Compiler.compile_json_schema`
    and :meth:`Compiler.compile_tools`; :meth:`save` writes it to a file (triemask's format)
    and :meth:`load` maps it back in another process.
    """

    def __init__(
        self,
        compiler: Compiler,
        schema: Any,
        *,
        any_whitespace: bool = True,
        indent: int | None = None,
        separators: tuple[str, str] | None = None,
        strict_mode: bool = True,
        min_enum_values: int = DEFAULT_MIN_ENUM_VALUES,
    ) -> None:
        _require_xgrammar()
        import xgrammar

        started = time.perf_counter()
        min_enum_values = integer(min_enum_values, "min_enum_values", SchemaError, "a positive integer")
        if min_enum_values < 1:
            raise SchemaError(f"min_enum_values must be at least 1, got {min_enum_values}", path="$")
        self._options: dict[str, Any] = {
            "any_whitespace": any_whitespace,
            "indent": indent,
            "separators": _json_separators(separators),
            "strict_mode": strict_mode,
        }
        self._schema = load_schema(schema)
        structural, sites = dispatch(self._schema, min_enum_values)
        self._vocab = compiler.vocab
        support = _support(self._vocab)
        self._support = support
        try:
            grammar = xgrammar.Grammar.from_json_schema(json.dumps(structural), **self._options)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise SchemaError(f"xgrammar cannot compile the schema: {exc}", path="$") from None
        ebnf = str(grammar)
        # one trie per distinct value set, one sentinel per trie
        by_values: dict[Any, int] = {}
        fields: list[_Field] = []
        width = max(1, (len(sites).bit_length() + 3) // 4)
        for site in sites:
            # 1 and True are distinct values; a pattern is its own key
            key = (tuple(map(type, site.values)), site.values) if site.pattern is None else ("pattern", site.pattern)
            k = by_values.get(key)
            if k is None:
                k = by_values[key] = len(fields)
                built = _compile_field(compiler, support, (site.path,), site.values, site.pattern)
                fields.append(replace(built, placeholders=(site.placeholder,), sentinel=_sentinel(k, width)))
            else:
                f = fields[k]
                fields[k] = replace(f, paths=(*f.paths, site.path), placeholders=(*f.placeholders, site.placeholder))
        self._min_enum_values = min_enum_values
        self._ebnf = ebnf
        self._finish(fields, support.grammar_compiler.compile_grammar(_structure_grammar(ebnf, _sentinels(fields))))
        self._compile_seconds = time.perf_counter() - started

    def _finish(self, fields: Sequence[_Field], grammar: Any) -> None:
        """What the fields and the structure's grammar imply (compiled or loaded alike)."""
        self._fields = tuple(fields)
        self._grammar = grammar
        self._crossing: frozenset[int] = frozenset().union(*(f.crossing for f in fields))
        self._fields_by_prefix: dict[int, list[int]] = {}
        for k, f in enumerate(fields):
            for prefix in {*f.enter_masks, *f.middle_by_prefix}:
                self._fields_by_prefix.setdefault(prefix, []).append(k)
        self._starts_first = bytes(sorted({c for f in fields for c in f.first}))

    # ------------------------------------------------------------------ public

    @property
    def vocab_size(self) -> int:
        """The model's logits width; bitmask rows have ``ceil(vocab_size / 32)`` words."""
        return self._vocab.vocab_size

    @property
    def vocab_fingerprint(self) -> str:
        return self._vocab.fingerprint

    @property
    def schema(self) -> dict[str, Any]:
        """The schema as given (a copy)."""
        copied: dict[str, Any] = json.loads(json.dumps(self._schema))
        return copied

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._vocab.eos_token_ids

    @property
    def memory_bytes(self) -> int:
        """Bytes held by the tries, their boundary tables and xgrammar's compiled grammar."""
        total = int(self._grammar.memory_size_bytes)
        for f in self._fields:
            total += f.automaton.memory_bytes + f.accepting.nbytes + f.leaves.nbytes
            total += f.exit_nodes.nbytes + f.exit_pieces.nbytes + f.exit_values.nbytes
            total += sum(w.nbytes + b.nbytes for w, b in f.enter_masks.values())
            total += 64 * (len(f.tails) + len(f.middles) + len(f.crossing))
        return total

    def stats(self) -> dict[str, Any]:
        """Which fields went to which engine, their sizes, and the compile time."""
        return {
            "trie_fields": [
                {
                    "paths": list(f.paths),
                    "values": f.automaton.num_values,
                    "trie_nodes": f.automaton.num_nodes,
                    "pattern": getattr(f.automaton, "pattern", None),
                    "memory_bytes": f.automaton.memory_bytes,
                    "compile_seconds": f.compile_seconds,
                }
                for f in self._fields
            ],
            "structure": {"engine": "xgrammar", "memory_bytes": int(self._grammar.memory_size_bytes)},
            "options": dict(self._options),
            "memory_bytes": self.memory_bytes,
            "compile_seconds": self._compile_seconds,
        }

    # ------------------------------------------------------------------ files

    _kind = "schema"

    @property
    def fingerprint(self) -> str:
        """Fingerprint of what was compiled: the schema (or tool list) and the options."""
        return _fingerprint(self._kind, self._described(), self._file_options())

    def compiled_from(self, given: Any, **options: Any) -> bool:
        """Whether this is what compiling ``given`` (a schema, or a tool list for
        :class:`CompiledTools`) with ``options`` gives: the same JSON and every option equal,
        defaults included. The compile cache checks a file of its disk tier with it, so that
        a file under another schema's name never answers."""
        defaults = {
            name: parameter.default
            for name, parameter in inspect.signature(type(self).__init__).parameters.items()
            if parameter.default is not inspect.Parameter.empty
        }
        if options.keys() - defaults.keys():
            return False
        resolved = {name: default if options.get(name) is None else options[name] for name, default in defaults.items()}
        try:
            resolved["separators"] = _json_separators(resolved["separators"])
            described = self._described_for(given)
        except (TriemaskError, TypeError, ValueError, RecursionError):
            return False
        return _fingerprint(self._kind, described, resolved) == self.fingerprint

    def _described(self) -> Any:
        """What the file stores to describe what was compiled (the tool list for tools)."""
        return self._schema

    @classmethod
    def _described_for(cls, given: Any) -> Any:
        """:meth:`_described` of what compiling ``given`` would give."""
        return load_schema(given)

    def _file_options(self) -> dict[str, Any]:
        return {**self._options, "min_enum_values": self._min_enum_values}

    def _file_parts(self) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any]]]:
        arrays: dict[str, npt.NDArray[Any]] = {
            "described": _text_array(json.dumps(self._described(), sort_keys=True)),
            "ebnf": _text_array(self._ebnf),
            "grammar": _text_array(self._grammar.serialize_json()),
        }
        fields = []
        for k, f in enumerate(self._fields):
            kind, automaton_meta, automaton_arrays = f.automaton.file_parts()
            arrays.update({f"f{k}.automaton.{name}": array for name, array in automaton_arrays.items()})
            arrays.update({f"f{k}.{name}": array for name, array in _field_tables(f).items()})
            fields.append(
                {
                    "paths": list(f.paths),
                    "placeholders": list(f.placeholders),
                    "sentinel": f.sentinel.hex(),
                    "first": f.first.hex(),
                    "last": f.last.hex(),
                    "pieces_fingerprint": f.pieces.fingerprint,
                    "automaton_kind": kind,
                    "automaton_meta": automaton_meta,
                    "compile_seconds": f.compile_seconds,
                }
            )
        meta = {
            "vocab_fingerprint": self._vocab.fingerprint,
            "options": self._file_options(),
            "xgrammar_version": version("xgrammar"),
            "compile_seconds": self._compile_seconds,
            "fields": fields,
        }
        return meta, arrays

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the compiled schema to ``path`` in triemask's file format (no pickle): the
        schema, its options, every enum field's automaton and boundary tables, and
        xgrammar's compiled structure, with the vocabulary's fingerprint, checksummed and
        written atomically. Load it with :meth:`load`."""
        meta, arrays = self._file_parts()
        _storage.write(
            path, self._kind, meta, arrays, vocab_fingerprint=self._vocab.fingerprint, set_fingerprint=self.fingerprint
        )

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], *, vocab: Any, mmap: bool = True, verify: bool = True
    ) -> CompiledSchema:
        """Load a compiled schema (or tool list) written by :meth:`save`.

        Parameters
        ----------
        path : str or path
            The file.
        vocab : Vocabulary or Compiler
            The vocabulary it must have been compiled for (checked by fingerprint). A tool
            list compiles its tools' argument schemas on demand with this compiler (one is
            made from a vocabulary).
        mmap, verify : bool
            As in :meth:`TrieAutomaton.load`.

        Raises
        ------
        AutomatonFileError
            The file is missing, truncated, corrupt, not a triemask file, of a newer format,
            not a compiled schema of this class, or compiled for another vocabulary, or its
            fields were built by a triemask whose token pieces differ (``.field``).
        """
        from ._compile import Compiler
        from ._vocabulary import Vocabulary

        if isinstance(vocab, Compiler):
            compiler: Compiler | None = vocab
            vocabulary = vocab.vocab
        elif isinstance(vocab, Vocabulary):
            compiler, vocabulary = None, vocab
        else:
            raise ArgumentTypeError(
                f"load needs vocab=<the triemask.Vocabulary or Compiler>, got {type(vocab).__qualname__}"
            )

        def build(stored: _storage.Stored) -> CompiledSchema:
            held = _SCHEMA_KINDS[stored.kind]
            if not issubclass(held, cls):
                raise AutomatonFileError(f"{stored.source} holds a {held.__name__}, not a {cls.__name__}", field="kind")
            return held._restore(stored, vocabulary, compiler)

        return _storage.load(
            path,
            kinds=tuple(_SCHEMA_KINDS),
            vocab_fingerprint=vocabulary.fingerprint,
            build=build,
            use_mmap=mmap,
            verify=verify,
        )

    @classmethod
    def _restore(cls, stored: _storage.Stored, vocab: Vocabulary, compiler: Compiler | None) -> CompiledSchema:
        _require_xgrammar()
        import xgrammar

        self = cls.__new__(cls)
        meta, arrays, source = stored.meta, stored.arrays, stored.source
        support = _support(vocab)
        try:
            options = meta["options"]
            self._min_enum_values = integer(options["min_enum_values"], "min_enum_values")
            self._options = {key: options[key] for key in ("any_whitespace", "indent", "separators", "strict_mode")}
            if self._options["separators"] is not None:
                self._options["separators"] = tuple(self._options["separators"])
            described = json.loads(_array_text(arrays["described"]))
            self._ebnf = _array_text(arrays["ebnf"])
            grammar_json = _array_text(arrays["grammar"])
            fields = [_restore_field(stored, support, k, entry) for k, entry in enumerate(meta["fields"])]
            self._compile_seconds = float(meta["compile_seconds"])
        except AutomatonFileError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, StateError) as error:
            raise AutomatonFileError(
                f"{source} is corrupt: its fields do not form a compiled schema ({type(error).__name__}: {error})",
                field="arrays",
            ) from None
        self._vocab = vocab
        self._support = support
        try:  # xgrammar's own form; compiled again from the structure's grammar text when its
            # xgrammar version reads it no longer
            grammar = xgrammar.CompiledGrammar.deserialize_json(grammar_json, support.info)
        except Exception:  # xgrammar raises several kinds for one answer: not readable
            try:
                grammar = support.grammar_compiler.compile_grammar(_structure_grammar(self._ebnf, _sentinels(fields)))
            except Exception as error:
                raise AutomatonFileError(
                    f"{source} is corrupt: its structure's grammar does not compile ({error})", field="ebnf"
                ) from None
        self._finish(fields, grammar)
        self._restore_described(described, meta, vocab, compiler)
        return self

    def _restore_described(
        self, described: Any, meta: dict[str, Any], vocab: Vocabulary, compiler: Compiler | None
    ) -> None:
        self._schema = load_schema(described)

    def __reduce__(self) -> tuple[Any, ...]:
        # pickling goes through the file format, with the vocabulary (a schema needs its tokens)
        meta, arrays = self._file_parts()
        blob = _storage.to_bytes(
            self._kind, meta, arrays, vocab_fingerprint=self._vocab.fingerprint, set_fingerprint=self.fingerprint
        )
        return (_schema_from_bytes, (blob, self._vocab))

    def __repr__(self) -> str:
        sizes = ", ".join(str(f.automaton.num_values) for f in self._fields)
        return f"CompiledSchema(trie fields: [{sizes}], vocab_size={self.vocab_size})"

    # ------------------------------------------------------------------ decoding

    def _initial(self) -> list[Configuration]:
        import xgrammar

        return [(self, xgrammar.GrammarMatcher(self._grammar, max_rollback_tokens=-1), _STRUCT, 0, b"", None)]

    def _exit(self, matcher: Any, k: int, node: int, value_start: bytes) -> list[Configuration]:
        """Configurations just after field ``k``'s value, completed at ``node``
        (``value_start``: the output before the value). The matcher is already past
        the sentinel: the structure resumes where it is."""
        return [(self, matcher, _STRUCT, 0, b"", None)]

    def _settle(
        self, matcher: Any, k: int, node: int, value_start: bytes, cache: dict[Any, Any]
    ) -> list[Configuration]:
        """Configurations at trie node ``node``: inside the value, after it, or both."""
        field = self._fields[k]
        found: list[Configuration] = []
        if not field.leaves[node]:
            found.append((self, matcher, k, node, value_start, cache))
        if field.accepting[node]:
            found += self._exit(matcher, k, node, value_start)
        return found

    def _feed(self, matcher: Any, data: bytes, before: bytes | bytearray) -> list[Configuration]:
        """Configurations after the bytes ``data`` from a structural configuration
        (every reading: structure alone, or entering a field at each possible start)."""
        found: list[Configuration] = []
        whole = matcher.fork()
        if whole.accept_string(data):
            found.append((self, whole, _STRUCT, 0, b"", None))
        for j in _starts(data, self._starts_first):
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
                for i in _ends(piece, field.last):
                    value_node = field.middles.get(piece[:i])
                    if value_node is not None:
                        for config in self._exit(entered, k, value_node, value_start):
                            found += config[0]._feed(config[1], piece[i:], value_start + piece[:i])
        return found

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
        if k == _STRUCT:
            if data is None or token not in self._crossing:
                following = matcher.fork()
                return [(self, following, _STRUCT, 0, b"", None)] if following.accept_token(token) else []
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
                    found += after[0]._feed(after[1], data[end:], value_start + data[:end])
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
        _, matcher, k, node, value_start, cache = config
        support = self._support
        if k == _STRUCT:
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
        while e < len(view) and view[e] == node:
            self._fill_exits(matcher, k, int(field.exit_pieces[e]), int(field.exit_values[e]), value_start, cache, row)
            e += 1
        return True

    def _fill_exits(
        self,
        matcher: Any,
        k: int,
        piece: int,
        value_node: int,
        value_start: bytes,
        cache: dict[Any, Any],
        row: npt.NDArray[np.int32],
    ) -> None:
        """Add the tokens whose head ``piece`` ends field ``k``'s value and whose rest
        the structure accepts after it."""
        pieces = self._fields[k].pieces
        lo, hi = int(pieces.head_offsets[piece]), int(pieces.head_offsets[piece + 1])
        tokens = pieces.head_tokens[lo:hi]
        # What follows the value: the same for every value, except where the value
        # picks the grammar that follows (a tool's arguments). Computed once per value.
        key = value_node if self._switches(k) else -1
        found = cache.get(key)
        if found is None:
            after_configs = self._exit(matcher, k, value_node, value_start)
            after = None
            if len(after_configs) == 1 and after_configs[0][2] == _STRUCT:
                after = np.zeros(self._support.xgr_width, dtype=np.int32)
                after_configs[0][1].fill_next_token_bitmask(after.reshape(1, -1))
            found = cache[key] = (after_configs, after)
        after_configs, after = found
        if after is not None:
            # one gather for three questions per head: is the rest a token the structure
            # takes; is its longest token prefix refused; may a value start in it again
            ids = pieces.head_lookups[:, lo:hi]
            safe = np.maximum(ids, 0)
            bits = (ids >= 0) & ((after[safe >> 5] >> (safe & 31)) & 1).astype(bool)
            ok, alone, again = bits[0], bits[1] | (ids[1] < 0), bits[2] | (ids[2] == -1)
            _set_bits(row, tokens[ok])
            probe = ~ok & ((alone & (ids[0] < 0)) | again)
        else:
            probe = np.ones(hi - lo, dtype=bool)
        for h in (lo + np.flatnonzero(probe)).tolist():
            token, end = int(pieces.head_tokens[h]), int(pieces.head_ends[h])
            data = self._support.tokens[token]
            assert data is not None
            rest = data[end:]
            verdict = cache.get((rest, key))
            if verdict is None:  # configurations are never modified: _feed forks
                verdict = cache[(rest, key)] = any(
                    c[0]._feasible(c[1], rest, value_start + data[:end]) for c in after_configs
                )
            if verdict:
                _set_bits(row, np.array([token]))

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
                if any(c[0]._feasible(c[1], data[end:], value_start + data[start:end]) for c in after):
                    _set_bits(row, np.array([token]))
        return entered


_SCHEMA_KINDS: dict[str, type[CompiledSchema]] = {"schema": CompiledSchema}


def register_schema_kind(cls: type[CompiledSchema]) -> type[CompiledSchema]:
    """Let files of ``cls._kind`` load as ``cls`` (compiled tool lists register themselves)."""
    _SCHEMA_KINDS[cls._kind] = cls
    return cls


def _schema_from_bytes(blob: bytes, vocab: Vocabulary) -> CompiledSchema:
    stored = _storage.read(blob, kinds=tuple(_SCHEMA_KINDS))
    stored.check_vocabulary(vocab.fingerprint)
    return _SCHEMA_KINDS[stored.kind]._restore(stored, vocab, None)


def _set_bits(row: npt.NDArray[np.int32], tokens: npt.NDArray[np.int64]) -> None:
    np.bitwise_or.at(row.view(np.uint32), tokens >> 5, np.left_shift(np.uint32(1), (tokens & 31).astype(np.uint32)))


# --------------------------------------------------------------------------- matcher


class SchemaMatcher:
    """Follows one output through a :class:`CompiledSchema` (``triemask.Matcher(compiled)``).

    The same interface as :class:`~triemask.Matcher` for a set; :attr:`value` is
    the parsed JSON once the output is complete.
    """

    __slots__ = ("_configs", "_filled", "_history", "_lexer", "_output", "_schema", "_scratch", "_scratch_width")

    def __init__(self, schema: CompiledSchema, *, max_rollback: int = 16) -> None:
        if not isinstance(schema, CompiledSchema):
            raise ArgumentTypeError(f"SchemaMatcher needs a CompiledSchema, got {type(schema).__qualname__}")
        max_rollback = integer(max_rollback, "max_rollback", StateError, "an integer in [0, 2**31)")
        if not 0 <= max_rollback < 1 << 31:
            raise StateError(f"max_rollback must be an integer in [0, 2**31), got {max_rollback}")
        self._schema = schema
        self._configs = schema._initial()
        # (configurations, output length, lexer state, the matcher advanced in place or None) per step
        self._history: deque[tuple[list[Configuration], int, int, Any]] = deque(maxlen=max_rollback)
        self._output = bytearray()
        self._lexer = _OUT  # the JSON lexer state at the end of the output
        self._scratch = np.zeros((1, schema._support.xgr_width), dtype=np.int32)
        self._scratch_width = schema._support.width
        self._filled: list[Configuration] | None = None

    @property
    def schema(self) -> CompiledSchema:
        """The shared compiled schema."""
        return self._schema

    @property
    def text(self) -> bytes:
        """The output so far, as bytes."""
        return bytes(self._output)

    @property
    def in_enum_value(self) -> bool:
        """Whether the output may be inside an enum field's value (a trie decides the next
        token), rather than in the structure xgrammar follows."""
        return any(c[2] != _STRUCT for c in self._configs)

    @property
    def value(self) -> Any:
        """The output parsed as JSON once it is complete, else None.

        A complete output is strict JSON (RFC 8259) in UTF-8: the masks refuse the raw
        control characters and the UTF-8 spelling of surrogates that xgrammar's strings
        admit (an escaped ``\\ud800`` is JSON and stays allowed).

        Raises
        ------
        StateError
            Never expected: the output is complete but not JSON.
        """
        if not any(c[2] == _STRUCT and (c[1].is_completed() or c[1].is_terminated()) for c in self._configs):
            return None
        try:
            return json.loads(self._output.decode("utf-8"))
        except ValueError as error:  # never expected: the masks keep outputs strict JSON
            raise StateError(f"the completed output is not JSON ({error}): {bytes(self._output)[:80]!r}") from None

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (state unchanged) when it is not allowed."""
        if type(token_id) is not int:
            try:
                token_id = integer(token_id, "token_id")
            except StateError:
                return False
        schema = self._schema
        support = schema._support
        if not 0 <= token_id < schema.vocab_size:
            return False
        if token_id < len(support.tokens):
            data = support.tokens[token_id]
            lexer = support.lexical.after[self._lexer][token_id]
            if lexer == _REFUSED:
                return False
        else:
            data, lexer = None, self._lexer
        if data is None and token_id not in schema.eos_token_ids:
            return False
        configs = self._configs
        config = configs[0]
        if (
            len(configs) == 1
            and config[2] == _STRUCT
            and (data is None or token_id not in config[0]._crossing or self._filled is configs)
        ):
            # (a mask filled for these configurations found no field to enter: no token does)
            # the common step: one structural reading, a token that cannot enter a field.
            # Advance xgrammar in place; rollback undoes it with xgrammar's own rollback.
            if not config[1].accept_token(token_id):
                return False
            self._history.append((configs, len(self._output), self._lexer, config[1]))
        else:
            following: list[Configuration] = []
            for config in configs:
                following += config[0]._token(config, token_id, data, self._output)
            if not following:
                return False
            self._history.append((configs, len(self._output), self._lexer, None))
            self._configs = following
        self._lexer = lexer
        self._filled = None  # the state moved: what the last fill found no longer holds
        if data is not None:
            self._output += data
        return True

    def accept_tokens(self, token_ids: Iterable[int]) -> int:
        """Accept tokens in order until one is rejected; returns how many were accepted."""
        if not isinstance(token_ids, Iterable):
            raise ArgumentTypeError(f"token_ids must be an iterable of integers, got {type(token_ids).__name__}")
        accepted = 0
        for token_id in token_ids:
            if not self.accept_token(token_id):
                break
            accepted += 1
        return accepted

    def rollback(self, num_tokens: int = 1) -> None:
        """Undo the last ``num_tokens`` accepted tokens."""
        num_tokens = integer(num_tokens, "num_tokens", StateError, "an integer")
        if num_tokens < 0 or num_tokens > len(self._history):
            raise StateError(
                f"cannot roll back {num_tokens} tokens: {len(self._history)} can be undone "
                f"(max_rollback={self._history.maxlen})"
            )
        for _ in range(num_tokens):
            self._configs, length, self._lexer, advanced = self._history.pop()
            if advanced is not None:
                advanced.rollback(1)
            del self._output[length:]
        self._filled = None

    def reset(self) -> None:
        """Return to the start and forget the history."""
        self._configs = self._schema._initial()
        self._history.clear()
        self._output.clear()
        self._lexer = _OUT
        self._filled = None

    def copy(self) -> SchemaMatcher:
        """An independent matcher in the same state, with the same rollback history."""
        forks: dict[int, Any] = {}

        def fork(matcher: Any) -> Any:
            # xgrammar's fork keeps the matcher's own rollback history
            if id(matcher) not in forks:
                forks[id(matcher)] = matcher.fork()
            return forks[id(matcher)]

        def copied(configs: list[Configuration]) -> list[Configuration]:
            return [(c[0], fork(c[1]), *c[2:]) for c in configs]

        clone = SchemaMatcher.__new__(SchemaMatcher)
        clone._schema = self._schema
        clone._configs = copied(self._configs)
        clone._history = deque(
            (
                (copied(configs), length, lexer, None if advanced is None else fork(advanced))
                for configs, length, lexer, advanced in self._history
            ),
            maxlen=self._history.maxlen,
        )
        clone._output = bytearray(self._output)
        clone._lexer = self._lexer
        clone._scratch = np.zeros_like(self._scratch)
        clone._scratch_width = self._scratch_width
        clone._filled = None
        return clone

    def __copy__(self) -> SchemaMatcher:
        return self.copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> SchemaMatcher:
        return self.copy()  # the compiled schema is shared, as by copy()

    def __reduce__(self) -> Any:
        raise TypeError(
            "a SchemaMatcher cannot be pickled (it holds xgrammar matchers); use copy() within a "
            "process, or replay the accepted tokens into a new matcher"
        )

    def is_terminated(self) -> bool:
        """True once EOS was accepted (or the grammar allows nothing more)."""
        return any(c[2] == _STRUCT and c[1].is_terminated() for c in self._configs)

    def allowed_token_ids(self) -> npt.NDArray[np.int32]:
        """Ids allowed next, ascending."""
        row = np.zeros((1, self._schema._support.width), dtype=np.int32)
        self.fill_next_token_bitmask(row)
        bits = np.unpackbits(row.view(np.uint8), bitorder="little")[: self._schema.vocab_size]
        return np.flatnonzero(bits).astype(np.int32)

    def fill_next_token_bitmask(self, bitmask: Any, row: int = 0) -> None:
        """Overwrite row ``row`` of ``bitmask`` (int32, ``(batch, ceil(vocab_size / 32))``,
        numpy or CPU torch) with the mask of the next token."""
        if (  # the per-step path: as_bitmask_array's checks, inlined
            type(bitmask) is np.ndarray
            and bitmask.dtype == np.int32
            and bitmask.ndim == 2
            and bitmask.shape[1] == self._scratch_width
            and bitmask.flags.c_contiguous
            and bitmask.flags.writeable
            and type(row) is int
            and 0 <= row < bitmask.shape[0]
        ):
            self._fill(bitmask[row])
            return
        array = as_bitmask_array(bitmask, self._schema.vocab_size)
        row = integer(row, "row", StateError, "an integer")
        if not 0 <= row < array.shape[0]:
            raise StateError(f"row {row} is outside the bitmask's {array.shape[0]} rows")
        self._fill(array[row])

    def _fill(self, out: npt.NDArray[np.int32]) -> None:
        before = self._output
        first = self._configs[0]
        entered = first[0]._fill(first, out, self._scratch, before)
        if len(self._configs) > 1:
            other = np.empty_like(out)
            for config in self._configs[1:]:
                entered |= config[0]._fill(config, other, self._scratch, before)
                out |= other
        # strict JSON: no raw control byte inside a string, whatever the structure allows
        np.bitwise_and(out, self._schema._support.lexical.keep[self._lexer], out=out)
        # remembered for accept_token: no field can be entered from these configurations
        self._filled = None if entered else self._configs

    def __repr__(self) -> str:
        return f"SchemaMatcher(output={bytes(self._output)[-40:]!r}, configurations={len(self._configs)})"


def fill_next_token_bitmasks(
    matchers: Sequence[SchemaMatcher], bitmask: Any, rows: Sequence[int] | None = None
) -> None:
    """Fill one bitmask row per matcher in one call (row ``i`` by default for matcher ``i``).

    The serving-engine entry point: it checks the buffer once and skips the per-call
    checks of :meth:`SchemaMatcher.fill_next_token_bitmask`.
    """
    if not isinstance(matchers, Sequence) or not all(isinstance(m, SchemaMatcher) for m in matchers):
        raise ArgumentTypeError(f"matchers must be a sequence of SchemaMatcher objects, got {matchers!r:.60}")
    if not matchers:
        return
    array = as_bitmask_array(bitmask, matchers[0].schema.vocab_size)
    if rows is not None and not isinstance(rows, Iterable | np.ndarray):
        raise ArgumentTypeError(f"rows must be a sequence of integers, got {type(rows).__name__}")
    targets = list(range(len(matchers))) if rows is None else [integer(r, "rows") for r in rows]
    if len(targets) != len(matchers):
        raise StateError(f"rows must be {len(matchers)} integers (one per matcher), got {len(targets)}")
    for target in targets:
        if not 0 <= target < array.shape[0]:
            raise StateError(f"row {target} is outside the bitmask's {array.shape[0]} rows")
    for matcher, target in zip(matchers, targets, strict=True):
        if matcher.schema.vocab_size != matchers[0].schema.vocab_size:
            raise StateError("all matchers of one batch must share a vocabulary size")
        matcher._fill(array[target])


def allowed_token_rows(
    matchers: Sequence[SchemaMatcher | None],
    eos_token_ids: Iterable[int],
    width: int,
    on_error: Callable[[int, Exception], None] | None = None,
) -> npt.NDArray[np.bool_]:
    """The allowed tokens of a batch of rows as booleans, ``(len(matchers), width)``, for
    masking logits at once (``width`` may exceed the vocabulary: the extra columns are closed).

    A row that is None (a request gone wrong), terminated, or whose fill raises allows
    only EOS, so no row is ever all closed; ``on_error(row, error)`` is told of a fill that
    raised (a tool's arguments compiled on first use), and without it the error propagates.
    """
    eos = np.asarray(list(eos_token_ids), dtype=np.int64)
    live = [i for i, m in enumerate(matchers) if m is not None and not m.is_terminated()]
    vocab_size = matchers[live[0]].schema.vocab_size if live else width  # type: ignore[union-attr]
    bitmask = np.zeros((len(matchers), bitmask_width(vocab_size)), dtype=np.int32)
    filled = []
    for i in live:
        try:
            matchers[i]._fill(bitmask[i])  # type: ignore[union-attr]
            filled.append(i)
        except Exception as error:  # noqa: PERF203 - any failure closes that row alone
            if on_error is None:
                raise
            on_error(i, error)
            bitmask[i] = 0
    allowed = np.zeros((len(matchers), width), dtype=bool)
    columns = min(vocab_size, width)
    allowed[:, :columns] = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, :columns]
    ended = np.setdiff1d(np.arange(len(matchers)), np.asarray(filled, dtype=np.int64))
    allowed[np.repeat(ended, len(eos)), np.tile(eos, len(ended))] = True
    return allowed


def configurations_after(schema: CompiledSchema, data: bytes) -> list[Configuration]:
    """Every reading of ``schema`` after the bytes ``data`` from its start (for a tool's
    arguments entered from a tool call: ``_tools.CompiledTools``)."""
    start = schema._initial()[0]
    return schema._feed(start[1], data, b"")
