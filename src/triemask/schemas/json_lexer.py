"""Strict JSON per output: a byte automaton of the JSON lexer, tabulated per vocabulary."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..base import kernels
from ..vocab import Vocabulary
from .structure import BEGIN_NO_CHARACTER, SENTINEL_LEADS

# --------------------------------------------------------------------------- strict JSON

# The JSON lexer of an output, a byte automaton: outside strings, inside one (between
# characters), after a backslash in one, and inside a multi-byte UTF-8 character (what the
# next bytes may be: RFC 3629's table, so no overlong form, no surrogate, nothing past
# U+10FFFF). LEX_REFUSED: the bytes cannot continue strict JSON (RFC 8259) in UTF-8.
LEX_OUT, _IN, _ESCAPE, _TAIL1, _TAIL2, _TAIL3, _AFTER_E0, _AFTER_ED, _AFTER_F0, _AFTER_F4, LEX_REFUSED = range(11)
_LEXER_STATES = range(LEX_REFUSED)
_JSON_WHITESPACE = b" \t\n\r"


def _lexer_table() -> list[bytes]:
    """``table[state][byte]``: the lexer state after ``byte``."""
    table = [bytearray([LEX_REFUSED]) * 256 for _ in _LEXER_STATES]
    for c in range(0x20, 0x80):  # printable ASCII: outside strings and in them
        table[LEX_OUT][c] = _IN if c == 0x22 else LEX_OUT
        table[_IN][c] = {0x22: LEX_OUT, 0x5C: _ESCAPE}.get(c, _IN)
        table[_ESCAPE][c] = _IN  # (which escapes are JSON is the grammar's business)
    for c in _JSON_WHITESPACE:
        table[LEX_OUT][c] = LEX_OUT
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


# Why a refusal happened, by the refused byte and the state it came in (what the C steps
# may leave to xgrammar, which refuses the same by its grammar: see Lexical):
REFUSED_ANYWHERE = 0  # a byte no JSON text holds there (not UTF-8, a sentinel's lead, a bad escape)
REFUSED_OUTSIDE = 1  # a byte outside strings other than a sentinel's lead (0xFF, 0x01)
REFUSED_CONTROL = 2  # a raw control character (0x00-0x1F) inside a string, or after its backslash


def _refusal(state: int, c: int) -> int:
    if state == LEX_OUT:
        return REFUSED_ANYWHERE if c in SENTINEL_LEADS else REFUSED_OUTSIDE
    return REFUSED_CONTROL if state in (_IN, _ESCAPE) and c < 0x20 else REFUSED_ANYWHERE


def _lex(data: bytes, state: int) -> tuple[int, int]:
    """The lexer state after ``data`` from ``state`` (or ``LEX_REFUSED``), and why a refusal
    came (``REFUSED_*``; 0 where none did)."""
    for c in data:
        following = _LEXER[state][c]
        if following == LEX_REFUSED:
            return LEX_REFUSED, _refusal(state, c)
        state = following
    return state, REFUSED_ANYWHERE


@dataclass(frozen=True)
class Lexical:
    """Per vocabulary, what each token does to the JSON lexer state of an output: refused
    are the tokens that would put a raw control character or bytes that are not UTF-8
    inside a string (xgrammar's length-bounded strings and its patterns admit some), and
    the sentinels' lead bytes (0xFF and 0x01) anywhere."""

    after: tuple[bytes, ...]  # by start state, by token id: the state after it, or LEX_REFUSED
    keep: npt.NDArray[np.int32]  # (start states, width): the bitmask of the tokens not refused
    never: npt.NDArray[np.bool_]  # by token id: refused from every state (no piece of it is needed)
    # keep, less the refusals at a byte outside strings that is not a sentinel's lead:
    # xgrammar's JSON structure holds none of those bytes (JSON's punctuation, literals,
    # numbers and whitespace are ASCII; a lead only where a field's sentinel is), and less
    # the refusals at a token's first byte between a string's characters of a byte that
    # begins none (BEGIN_NO_CHARACTER: xgrammar's free text holds none there,
    # structure.check_entry_unforgeable), so the C step ANDs this sparser row
    # (tests/test_schema_native.py checks, against the reference's keep, that nothing else differs).
    string_keep: npt.NDArray[np.int32]
    # string_keep, less the refusals of a raw control character inside a string: what the C
    # step ANDs for a grammar none of whose character classes or literals admits one inside
    # a string (structure.controls_in_strings), where xgrammar refuses them itself. Between a
    # string's characters this row changes none of Qwen's 4,748 words (string_keep: 2,014; 116
    # and 2,058 when it kept the first bytes that begin no character), outside strings 1 (332).
    utf8_keep: npt.NDArray[np.int32]

    @classmethod
    def of(cls, vocab: Vocabulary, width: int) -> Lexical:
        """The tables of ``vocab``'s tokens, rows of ``width`` words: the lexer runs in C where
        the extension is built (``lex_tokens``), else in :func:`lex_reference`, which the tests
        compare it with."""
        native = kernels.KERNELS
        lengths, offsets, data = vocab.byte_table()
        n = len(lengths)
        if native is None:
            after, why = lex_reference([vocab.token_bytes(t) for t in range(n)])
        else:
            found = native.lex_tokens(data, np.ascontiguousarray(offsets[:n]), lengths, *_C_TABLES)
            after = np.frombuffer(found[0], dtype=np.uint8).reshape(len(_LEXER_STATES), n)
            why = np.frombuffer(found[1], dtype=np.uint8).reshape(len(_LEXER_STATES), n)
        refused = after == LEX_REFUSED
        # refused at a first byte that begins no character, between a string's characters
        spelled = lengths > 0
        first = np.zeros(n, dtype=np.uint8)
        first[spelled] = np.frombuffer(data, dtype=np.uint8)[offsets[:n][spelled]]
        left_to_xgrammar = np.zeros_like(refused)
        left_to_xgrammar[_IN] = spelled & np.isin(first, np.frombuffer(BEGIN_NO_CHARACTER, dtype=np.uint8))
        return cls(
            tuple(row.tobytes() for row in after),
            _keep_rows(refused, width),
            refused.all(axis=0),
            _keep_rows(refused & (why != REFUSED_OUTSIDE) & ~left_to_xgrammar, width),
            _keep_rows(refused & (why == REFUSED_ANYWHERE) & ~left_to_xgrammar, width),
        )


def lex_reference(tokens: Sequence[bytes | None]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """By start state and token: the lexer state after the token, and why it was refused
    (``REFUSED_*``, 0 where it was not; the Python reference of ``lex_tokens``)."""
    n = len(tokens)
    after = np.repeat(np.arange(len(_LEXER_STATES), dtype=np.uint8)[:, None], n, axis=1)  # specials move nothing
    why = np.zeros((len(_LEXER_STATES), n), dtype=np.uint8)
    for t, data in enumerate(tokens):
        if not data:
            continue
        if _PLAIN_TEXT.match(data):  # most tokens: no state but a character's middle changes
            after[_ESCAPE, t] = _IN
            after[_TAIL1:, t] = LEX_REFUSED
        else:
            for state in _LEXER_STATES:
                after[state, t], why[state, t] = _lex(data, state)
    return after, why


def _c_tables() -> tuple[bytes, bytes]:
    """``lex_tokens``'s tables: the state after each byte by state, and why refusing that
    byte there is a refusal (``REFUSED_*``)."""
    why = bytes(_refusal(state, c) for state in _LEXER_STATES for c in range(256))
    return b"".join(_LEXER), why


_C_TABLES = _c_tables()


def _keep_rows(refused: npt.NDArray[np.bool_], width: int) -> npt.NDArray[np.int32]:
    """Per state, the bitmask of the tokens not ``refused`` (the ids past them kept)."""
    kept = np.ones((len(refused), 32 * width), dtype=bool)
    kept[:, : refused.shape[1]] = ~refused
    return np.packbits(kept, axis=1, bitorder="little").view(np.int32)


# Free text of every kind xgrammar builds for JSON (strings plain, length-bounded, with a
# pattern, a format; free property names), and prefixes that lead into each: none may
# accept the sentinel's lead byte.
