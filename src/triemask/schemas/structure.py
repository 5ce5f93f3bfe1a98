"""The structural grammar of a mixed schema: sentinels where fields go, checked unforgeable,
and where a value may start and end inside a token."""

from __future__ import annotations

import json
from functools import cache
from importlib.metadata import version
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ..base import SchemaError, kernels

DEFAULT_MIN_ENUM_VALUES = 256
"""Enums with at least this many values go to a trie. Measured (``python -m benchmarks
schemas --threshold``, docs/schemas.md): from about 128-256 values on the trie compiles faster
than xgrammar's alternation, 3x faster at 1,000 and 25-100x beyond 10,000; per step xgrammar
is faster up to a few thousand values, so schemas reused by many requests may want more."""

DEFAULT_MIN_UNION_BRANCHES = 32
"""Discriminated unions (``reading.union_values``) with at least this many branches go to a
trie of their discriminator, each branch compiled when first chosen. Measured on vLLM's
``tool_choice="required"`` schema over real functions (Qwen, docs/benchmarks.md): the trie
compiles 8.6-12x faster than xgrammar's union from 8 branches on (a new structure in a warm
process 2.1x at 8, 4.5x at 32, 6x at 50); the steps are faster from 8, the batch of 64 0.97x
xgrammar's at 8, 1.05x at 16, 1.16x at 32, 1.22x at 50. But the first choice of each branch
compiles its schema inside a decoding step (a serving engine's whole batch waits), 2.7 ms
(1.2 of them xgrammar's, through its caches: the chosen schema's sentinels begin with
CONTROL_SENTINEL_LEAD), 17-19 ms for the first in a process, where xgrammar's one compile runs
ahead of decoding: from 32 branches, where that compile is 25 ms and more."""

_FOLLOW = b",}] \t\n\r"  # what can follow a JSON value
VALUE_FIRST = b'"-0123456789tfn'  # what a JSON scalar can start with
_VALUE_AFTER = frozenset(b":,[")  # the structure a value can follow (then whitespace)
_WHITESPACE_CODES = frozenset(b" \t\n\r")  # JSON's whitespace
SENTINEL_LEAD = 0xFF  # never in UTF-8, so in no text of the structure's language
CONTROL_SENTINEL_LEAD = 0x01
"""The sentinels' lead in a grammar none of whose strings or literals admits a raw control
character (:func:`controls_in_strings` False), where no text of its language holds this byte
(JSON's whitespace is the only raw control it has outside strings) but at a sentinel.
xgrammar's EBNF spells it (``\\x01``), so such a grammar compiles from its text through
xgrammar's caches, whose token masks of each rule (the JSON string's above all) every later
grammar shares: a union's choice of one of 50 tools 1.2 ms instead of 15 on Qwen. The JSON
lexer refuses it outside strings, as 0xFF (:func:`~.json_lexer.Lexical.of`)."""
SENTINEL_LEADS = (SENTINEL_LEAD, CONTROL_SENTINEL_LEAD)
BEGIN_NO_CHARACTER = bytes([*range(0x80, 0xC2), *range(0xF5, 0x100)])
"""The bytes that begin no UTF-8 character (RFC 3629: continuation bytes, the overlong leads
0xC0 and 0xC1, the leads past U+10FFFF; 0xFF, the sentinel's lead, among them). xgrammar's free
text holds none where a character begins (:func:`check_entry_unforgeable`), so the C fills leave
those refusals to it (:class:`~.json_lexer.Lexical`)."""
_SENTINEL_DIGITS = bytes(range(0x10, 0x20))
STRUCT = -1


def field_sentinel(k: int, width: int, lead: int) -> bytes:
    return bytes([lead, *(_SENTINEL_DIGITS[(k >> (4 * i)) & 15] for i in reversed(range(width)))])


def value_start_offsets(token: bytes, first: bytes) -> list[int]:
    """Offsets in ``token`` where a value starting with one of ``first`` may begin: where
    the bytes before are whitespace, or end in one of ``:,[`` and whitespace (one pass)."""
    found = []
    after_structure = True  # (the start: whatever came before the token)
    for j, c in enumerate(token):
        if after_structure and c in first:
            found.append(j)
        if c not in _WHITESPACE_CODES:
            after_structure = c in _VALUE_AFTER
    return found


def value_starts(
    data: bytes, offsets: npt.NDArray[np.int64], lengths: npt.NDArray[np.int32], first: bytes
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """:func:`value_start_offsets` of every token at once, by NumPy: token ``t`` is
    ``data[offsets[t]:offsets[t] + lengths[t]]`` (a negative length: no bytes), as
    :meth:`Vocabulary.byte_table` gives them. Returns the tokens and the offsets in them,
    ordered by token then offset."""
    ids, starts, byte = _token_bytes(data, offsets, lengths)
    at = np.flatnonzero(_byte_set(first)[byte])  # the places a value could start at
    token = np.searchsorted(starts, at, side="right") - 1
    start = starts[token]  # (the first byte of its token)
    # the last byte before each place that is not JSON whitespace, within the token (runs
    # of whitespace are short: the loop steps back over the places still on one)
    before = at - 1
    moving = np.flatnonzero(before >= start)
    moving = moving[_WHITESPACE[byte[before[moving]]]]
    while len(moving):
        before[moving] -= 1
        moving = moving[before[moving] >= start[moving]]
        moving = moving[_WHITESPACE[byte[before[moving]]]]
    ok = (before < start) | _byte_set(b":,[")[byte[np.maximum(before, 0)]]
    return ids[token[ok]], (at - start)[ok]


def value_ends(
    data: bytes, offsets: npt.NDArray[np.int64], lengths: npt.NDArray[np.int32], last: bytes
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """:func:`value_end_offsets` of every token at once (as :func:`value_starts`)."""
    ids, starts, byte = _token_bytes(data, offsets, lengths)
    at = np.flatnonzero(_byte_set(_FOLLOW)[byte[1:]] & _byte_set(last)[byte[:-1]]) + 1
    token = np.searchsorted(starts, at, side="right") - 1
    rank = at - starts[token]
    ok = rank > 0  # (the byte before is the same token's)
    return ids[token[ok]], rank[ok]


def _token_bytes(
    data: bytes, offsets: npt.NDArray[np.int64], lengths: npt.NDArray[np.int32]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.uint8]]:
    """The tokens with bytes (ids ascending), where each begins in the next array (and where
    the last ends), and their bytes one after the other: ``data`` itself, no copy, where the
    tokens lie in it so (a :class:`Vocabulary`'s own table), else gathered."""
    ids = np.flatnonzero(lengths > 0)
    counts = lengths[ids].astype(np.int64)
    starts = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    raw = np.frombuffer(data, dtype=np.uint8)
    base = int(offsets[ids[0]]) if len(ids) else 0
    if np.array_equal(offsets[ids], starts[:-1] + base) and base + starts[-1] <= len(raw):
        return ids, starts, raw[base : base + starts[-1]]
    rank = np.arange(starts[-1], dtype=np.int64) - np.repeat(starts[:-1], counts)
    return ids, starts, raw[np.repeat(offsets[ids], counts) + rank]


def _byte_set(members: bytes) -> npt.NDArray[np.bool_]:
    table = np.zeros(256, dtype=bool)
    table[list(members)] = True
    return table


_WHITESPACE = _byte_set(bytes(_WHITESPACE_CODES))


def value_end_offsets(token: bytes, last: bytes) -> list[int]:
    """Offsets ``i`` in ``token`` where a value ending with one of ``last`` may stop."""
    return [i for i in range(1, len(token)) if token[i] in _FOLLOW and token[i - 1] in last]


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
def check_entry_unforgeable() -> None:
    """Refuse an xgrammar whose free text can hold byte 0xFF: a field's entry (the sentinel)
    would then be forgeable inside a string; or can begin a character with one of
    :data:`BEGIN_NO_CHARACTER`, whose refusal the C fills leave to it. Once per process, on
    256 one-byte tokens, at a character's start in free text of every kind."""
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
        for byte in sorted({SENTINEL_LEAD, *BEGIN_NO_CHARACTER}, key=lambda b: b != SENTINEL_LEAD):
            in_mask = (int(mask[0, byte >> 5]) >> (byte & 31)) & 1
            if in_mask or matcher.fork().accept_string(bytes([byte])):
                what = (
                    "with which triemask marks where a field's value may start"
                    if byte == SENTINEL_LEAD
                    else "which begins no UTF-8 character"
                )
                raise ImportError(
                    f"the installed xgrammar ({version('xgrammar')}) lets free text (after {prefix!r}) hold byte "
                    f"0x{byte:02X}, {what}: its schemas would accept invalid JSON. Install an xgrammar that "
                    "keeps strings UTF-8 (0.2.x)."
                )


def structure_grammar(ebnf: str, sentinels: dict[str, bytes]) -> Any:
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


def sentinel_ebnf(ebnf: str, sentinels: dict[str, bytes]) -> str | None:
    """The EBNF text ``ebnf`` with each placeholder's literal (its JSON text, a key of
    ``sentinels``, as xgrammar prints it) spelled as that field's sentinel, escaped: what
    xgrammar parses into :func:`structure_grammar`'s grammar where every byte of the sentinels
    is a code point below 0x80 (:data:`CONTROL_SENTINEL_LEAD`). None where a placeholder occurs
    in the text other than as its own literal (never seen: each holds a random nonce)."""
    for placeholder, sentinel in sentinels.items():
        literal = json.dumps(json.dumps(placeholder))
        if ebnf.count(placeholder) != ebnf.count(literal) or not ebnf.count(literal):
            return None
        ebnf = ebnf.replace(literal, '"' + "".join(f"\\x{b:02x}" for b in sentinel) + '"')
    return ebnf


# --------------------------------------------------------------------------- raw controls

_EBNF_NAMED = {"n": 0x0A, "r": 0x0D, "t": 0x09, "0": 0x00, "b": 0x08, "f": 0x0C, "v": 0x0B, "a": 0x07, "e": 0x1B}
_EBNF_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}
_EBNF_BETWEEN = frozenset("_ \t\n\r:=|()*+?{},-")


def _ebnf_code(text: str, at: int) -> tuple[int, int] | None:
    """The code point at ``text[at]`` (an escape or a character) and where the next starts;
    None for an escape this reading does not know or a cut text."""
    if text[at] != "\\":
        return ord(text[at]), at + 1
    e = text[at + 1 : at + 2]
    if e in _EBNF_NAMED:
        return _EBNF_NAMED[e], at + 2
    if e in _EBNF_HEX_DIGITS:
        digits = text[at + 2 : at + 2 + _EBNF_HEX_DIGITS[e]]
        if len(digits) != _EBNF_HEX_DIGITS[e] or not all(d in "0123456789abcdefABCDEF" for d in digits):
            return None
        return int(digits, 16), at + 2 + len(digits)
    if e and "!" <= e <= "~" and not e.isalnum():
        return ord(e), at + 2
    return None


CONTROLS_KEYWORDS = (
    '"pattern": "',
    '"format": "',
    '"minLength": ',
    '"maxLength": ',
    '"patternProperties": ',
    '"propertyNames": ',
)
"""The keywords whose strings xgrammar compiles to other rules than its plain JSON string (a
regular expression, a length-bounded string of ``[^"\\\r\n]``, keys by a pattern), as
``json.dumps`` writes them with a value (a string for the first two: a property named
``format``, whose value is an object, is none of them)."""

_PLAIN_STRINGS_PROBE = {
    "type": "object",
    "properties": {
        "s": {"type": "string"},
        "c": {"const": "a b"},
        "e": {"enum": ["x", 1, None, True, {"k": ["v"]}]},
        "n": {"type": "number", "minimum": -1.5, "maximum": 2.5},
        "i": {"type": "integer", "minimum": 3, "exclusiveMaximum": 100},
        "b": {"type": ["boolean", "null", "string"]},
        "a": {"type": "array", "items": {"$ref": "#/$defs/d"}, "minItems": 1, "maxItems": 3},
        "t": {"type": "array", "prefixItems": [{"type": "string"}], "items": False},
        "u": {"anyOf": [{"type": "string"}, {"type": "object", "additionalProperties": True}]},
        "o": {
            "type": "object",
            "properties": {"p": {"type": "string"}},
            "required": ["p"],
            "additionalProperties": False,
        },
        "x": {},
        "m": {"type": "object", "additionalProperties": {"type": "string"}, "minProperties": 1},
    },
    "required": ["s", "c"],
    "additionalProperties": True,
    "$defs": {"d": {"type": "object", "properties": {"q": {"type": "string"}}}},
}
"""Every kind of string a schema makes whose text has no :data:`CONTROLS_KEYWORDS` and no
escape: plain strings, keys (of additional properties too, which exclude the named ones
character by character), any JSON value, literals of consts, enums and property names."""


@cache
def plain_strings_refuse_controls() -> bool:
    """Whether the installed xgrammar's plain strings and literals admit no raw control
    character: :func:`controls_in_strings` of its grammar of :data:`_PLAIN_STRINGS_PROBE`
    with and without free whitespace, strict and not. Once per process."""
    import xgrammar

    text = json.dumps(_PLAIN_STRINGS_PROBE)
    return not any(
        controls_in_strings(str(xgrammar.Grammar.from_json_schema(text, any_whitespace=spaced, strict_mode=strict)))
        for spaced in (False, True)
        for strict in (False, True)
    )


def plain_strings(text: str, options: dict[str, Any]) -> bool:
    """Whether xgrammar's grammar of the structure text ``text`` (``json.dumps`` of a schema)
    with ``options`` (``SchemaOptions.structure()``) holds only plain strings and literals,
    none admitting a raw control: none of :data:`CONTROLS_KEYWORDS` anywhere in ``text`` (in
    a const's object too: then the grammar is read), no escape (a property named with a
    control makes xgrammar's keys of additional properties spell that control raw), neither
    ``indent`` nor ``separators`` (whose newlines :func:`controls_in_strings` cannot tell from
    a string's), and the premise checked by :func:`plain_strings_refuse_controls`. Where it
    holds, the answer of :func:`controls_in_strings` without printing the grammar (0.7 ms for
    vLLM's schema of 50 tools, against 0.02 ms)."""
    return (
        options.get("indent") is None
        and options.get("separators") is None
        and "\\" not in text
        and not any(keyword in text for keyword in CONTROLS_KEYWORDS)
        and plain_strings_refuse_controls()
    )


def controls_in_strings(ebnf: str) -> bool:
    """Whether xgrammar's grammar ``ebnf`` (as xgrammar prints it) may admit a raw control
    character (0x00-0x1F) inside a JSON string; True wherever this reading cannot tell.
    In C where the extension is built (one pass: 0.3 ms for 500 tools' 320 KB), else
    :func:`controls_in_strings_reference`, which the tests compare it with."""
    native = kernels.KERNELS
    return bool(native.controls_in_strings(ebnf)) if native is not None else controls_in_strings_reference(ebnf)


def controls_in_strings_reference(ebnf: str) -> bool:
    """:func:`controls_in_strings` in Python.

    False when no byte-string literal holds a control (but literals of JSON whitespace only),
    no character class admits one (but classes of JSON whitespace only, ``[ \n\r\t]``; a
    negated class must exclude them all), and no construct is called by name (``Regex(...)``,
    ``TagDispatch(...)``: their texts are not read here). xgrammar's plain strings are
    ``[^\0-\x1f\"\\\r\n]``, its escapes ``[\"\\/bfnrt]``; its length-bounded strings are
    ``[^\"\\\r\n]`` (True). JSON whitespace is structure, outside strings: where the JSON lexer
    of the output is inside a string, so is xgrammar's parse (both close a string at its first
    unescaped quote), which the C steps rely on outside strings too, and which
    tests/test_schema_native.py checks against the reference's full keep rows.
    """
    at = 0
    while at < len(ebnf):
        c = ebnf[at]
        if c == '"':  # a literal
            points = set()
            at += 1
            while at < len(ebnf) and ebnf[at] != '"':
                found = _ebnf_code(ebnf, at)
                if found is None:
                    return True
                code, at = found
                points.add(code)
            if at >= len(ebnf):
                return True
            at += 1
            if min(points, default=0x20) < 0x20 and not points <= _WHITESPACE_CODES:
                return True
        elif c == "[":  # a character class
            negated = ebnf[at + 1 : at + 2] == "^"
            ranges = []
            at += 1 + negated
            while at < len(ebnf) and ebnf[at] != "]":
                found = _ebnf_code(ebnf, at)
                if found is None:
                    return True
                low, at = found
                high = low
                if ebnf[at : at + 1] == "-" and ebnf[at + 1 : at + 2] not in ("]", ""):
                    found = _ebnf_code(ebnf, at + 1)
                    if found is None:
                        return True
                    high, at = found
                ranges.append((low, high))
            if at >= len(ebnf):
                return True
            at += 1
            covered = {code for low, high in ranges for code in range(low, min(high, 0x1F) + 1)}
            if negated and len(covered) < 0x20:
                return True
            if not negated and covered and not all(lo == hi and lo in _WHITESPACE_CODES for lo, hi in ranges):
                return True
        elif c == "(" and at > 0 and ((ebnf[at - 1].isascii() and ebnf[at - 1].isalnum()) or ebnf[at - 1] == "_"):
            return True  # a construct called by name
        elif (c.isascii() and c.isalnum()) or c in _EBNF_BETWEEN:
            at += 1
        else:
            return True
    return False


# --------------------------------------------------------------------------- per vocabulary


class Configuration(NamedTuple):
    """One reading of the output so far (a decoding state is a few of them, usually one)."""

    schema: Any  # the CompiledSchema whose grammar ``matcher`` runs (a tool's arguments have their own)
    matcher: Any  # xgrammar's matcher: in the structure, or just past the field's sentinel
    field: int  # the trie field whose value is being spelled, or STRUCT
    node: int  # the node of that field's trie (0 in STRUCT)
    value_start: bytes  # the output before the value
    cache: Any  # shared by the configurations of one value (None in STRUCT)
