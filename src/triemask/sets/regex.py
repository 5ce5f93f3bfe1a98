"""Finite regular expressions to minimal acyclic byte automata.

A regex without unbounded repetition (``*``, ``+``, ``{n,}``) denotes a finite
language. This module parses such a pattern, builds its automaton over UTF-8
*bytes* (a character class over non-ASCII characters becomes the byte sequences
that encode it), determinises it and minimises it into a :class:`ByteDag`: the
unique smallest deterministic acyclic automaton of the language. The compiler
then matches the vocabulary against the DAG exactly as it matches a trie (a trie
is the special case where every node has one parent).

The syntax and its meaning follow xgrammar's regex converter, so that the two
engines constrain to the same language: ``.`` is any character (newline
included), ``\\d`` ``[0-9]``, ``\\w`` ``[A-Za-z0-9_]``, ``\\s`` the ECMAScript white
space; the pattern is anchored (the whole output matches; a leading ``^`` and a
trailing ``$`` are accepted and change nothing).

Pipeline: pattern -> syntax tree -> byte NFA (Thompson, with epsilon moves) ->
subset construction over byte intervals -> Revuz minimisation (states merged
bottom-up by height, an acyclic automaton needs no partition refinement) ->
nodes renumbered by their longest distance from the start, so that every edge
leads to a deeper level.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise
from typing import Any, Union

import numpy as np
import numpy.typing as npt

from ..base import (
    BoundedLRU,
    ByteDag,
    PatternError,
    UnboundedPatternError,
    canonical_numbering,
    dag_arrays,
    dag_from_buffers,
    kernels,
)

_Row = tuple[tuple[int, int, int], ...]  # (first byte, last byte, target), ascending

# Built-in formats: JSON Schema's ``format`` names whose language is finite, spelled
# as xgrammar spells them (date, uuid, ipv4, ipv6 are exactly xgrammar's languages);
# time and date-time cap the fraction of a second at 9 digits (nanoseconds) where
# RFC 3339 and xgrammar allow any number, which is what makes them finite.
_HOUR = "([01][0-9]|2[0-3])"
_TIME = _HOUR + ":[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]{1,9})?(Z|[+-]" + _HOUR + ":[0-5][0-9])"
_DATE = "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
_OCTET = "(25[0-5]|2[0-4][0-9]|[01]?[0-9]?[0-9])"
_H16 = "[0-9a-fA-F]{1,4}"
_IPV4_IN_6 = "(25[0-5]|(2[0-4]|1?[0-9])?[0-9])"
FORMATS: dict[str, str] = {
    "date": _DATE,
    "time": _TIME,
    "date-time": _DATE + "T" + _TIME,
    "uuid": "[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}",
    "ipv4": f"({_OCTET}\\.){{3}}{_OCTET}",
    "ipv6": (  # RFC 4291 text forms, as xgrammar's converter writes them
        f"(({_H16}:){{7}}{_H16}|({_H16}:){{1,7}}:|({_H16}:){{1,6}}:{_H16}|({_H16}:){{1,5}}(:{_H16}){{1,2}}"
        f"|({_H16}:){{1,4}}(:{_H16}){{1,3}}|({_H16}:){{1,3}}(:{_H16}){{1,4}}|({_H16}:){{1,2}}(:{_H16}){{1,5}}"
        f"|{_H16}:(:{_H16}){{1,6}}|:((:{_H16}){{1,7}}|:)"
        f"|::(ffff(:0{{1,4}}){{0,1}}:){{0,1}}({_IPV4_IN_6}\\.){{3}}{_IPV4_IN_6}"
        f"|({_H16}:){{1,4}}:({_IPV4_IN_6}\\.){{3}}{_IPV4_IN_6})"
    ),
}

_MAX_NFA_STATES = 50_000  # bounded work and memory for hostile patterns
_MAX_DFA_STATES = 50_000
# Subset construction can cost far more than its state count (large subsets of NFA states):
# a budget on the NFA states and moves it visits keeps a hostile pattern to about a second.
_MAX_WORK = 200_000  # about 0.06 s on this machine; every built-in format takes under 100,000
_LIMITS = {  # what a pattern passed, by the C kernel's name for it
    "nfa": f"the pattern expands to more than {_MAX_NFA_STATES} automaton states",
    "dfa": f"the pattern's automaton has more than {_MAX_DFA_STATES} states",
    "work": f"the pattern's automaton takes more than {_MAX_WORK:,} steps to build; simplify it "
    "(fewer nested repetitions of wide classes)",
}
_MAX_CODE_POINT = 0x10FFFF
_ANY = [(0, 0xD7FF), (0xE000, _MAX_CODE_POINT)]  # every character UTF-8 can spell
_DIGIT = [(0x30, 0x39)]
_WORD = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
_SPACE = [
    (0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
    (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF),
]  # fmt: skip
_SPECIAL = frozenset("([\\.*+?^${")  # what atom() reads as more than the character itself
_SHORT = {"n": 0x0A, "t": 0x09, "r": 0x0D, "f": 0x0C, "v": 0x0B, "0": 0x00}


# --------------------------------------------------------------------------- syntax tree


@dataclass(frozen=True)
class _Chars:
    ranges: tuple[tuple[int, int], ...]  # disjoint, ascending code point ranges


@dataclass(frozen=True)
class _Concat:
    parts: tuple[_Node, ...]


@dataclass(frozen=True)
class _Alt:
    options: tuple[_Node, ...]


@dataclass(frozen=True)
class _Repeat:
    body: _Node
    low: int
    high: int


_Node = Union[_Chars, _Concat, _Alt, _Repeat]  # noqa: UP007 - a runtime alias on Python 3.10


def _normalise(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return tuple(merged)


def _complement(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    start = 0
    for lo, hi in ranges:
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= _MAX_CODE_POINT:
        out.append((start, _MAX_CODE_POINT))
    return tuple(out)


class _Parser:
    """Recursive descent over the pattern; ``pos`` is the next character."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.pos = 0

    def fail(self, message: str, position: int | None = None, error: type[PatternError] = PatternError) -> PatternError:
        return error(message, pattern=self.pattern, position=self.pos if position is None else position)

    def peek(self) -> str | None:
        return self.pattern[self.pos] if self.pos < len(self.pattern) else None

    def parse(self) -> _Node:
        if self.peek() == "^":
            self.pos += 1
        node = self.alternation(depth=0)
        if self.pos < len(self.pattern):  # only an unmatched ")" stops an alternation early
            raise self.fail("unbalanced ')'")
        return node

    def alternation(self, depth: int) -> _Node:
        if depth > 200:
            raise self.fail("groups nested more than 200 deep")
        options = [self.sequence(depth)]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.sequence(depth))
        return options[0] if len(options) == 1 else _Alt(tuple(options))

    def sequence(self, depth: int) -> _Node:
        parts: list[_Node] = []
        pattern, end = self.pattern, len(self.pattern)
        while self.pos < end and (c := pattern[self.pos]) not in "|)":
            if c == "$" and self.pos == end - 1:
                self.pos += 1  # the trailing anchor: the match is anchored anyway
                break
            atom = self.atom(depth)
            # (a quantifier looked for only where one may start: a parse is a few calls a character)
            parts.append(self.quantified(atom) if self.pos < end and pattern[self.pos] in "*+?{" else atom)
        return parts[0] if len(parts) == 1 else _Concat(tuple(parts))

    def atom(self, depth: int) -> _Node:
        c = self.pattern[self.pos]
        if c not in _SPECIAL:
            self.pos += 1
            return _Chars(((ord(c), ord(c)),))
        if c == "(":
            open_at = self.pos
            self.pos += 1
            if self.pattern.startswith("?", self.pos):
                if self.pattern.startswith("?:", self.pos):
                    self.pos += 2
                elif self.pattern.startswith(("?P<", "?<"), self.pos) and not self.pattern.startswith(
                    ("?<=", "?<!"), self.pos
                ):
                    close = self.pattern.find(">", self.pos)
                    if close < 0:
                        raise self.fail("unterminated group name")
                    self.pos = close + 1
                else:
                    raise self.fail("lookaround, flags and other '(?' groups are not supported")
            node = self.alternation(depth + 1)
            if self.peek() != ")":
                raise self.fail("missing ')'", open_at)
            self.pos += 1
            return node
        if c == "[":
            return self.char_class()
        if c == "\\":
            return _Chars(self.escape(in_class=False))
        if c == ".":
            self.pos += 1
            return _Chars(tuple(_ANY))
        if c in "*+?":
            raise self.fail(f"nothing to repeat before {c!r}")
        if c in "^$":
            raise self.fail(f"anchor {c!r} inside the pattern is not supported (the pattern is anchored)")
        if c == "{" and self.repetition_bounds() is not None:
            raise self.fail("nothing to repeat before '{'")
        self.pos += 1
        return _Chars(((ord(c), ord(c)),))

    def repetition_bounds(self) -> tuple[int, int | None, int] | None:
        """``{n}``, ``{m,n}``, ``{m,}`` at ``pos``: (low, high or None, length), else None."""
        text = self.pattern
        end = text.find("}", self.pos)
        if end < 0:
            return None
        body = text[self.pos + 1 : end]
        low_text, comma, high_text = body.partition(",")
        if not (low_text.isdigit() and low_text.isascii()) or (high_text and not high_text.isascii()):
            return None  # (ASCII digits only, as Python's re reads them: int("²") would raise)
        if high_text and not high_text.isdigit():
            return None
        low = int(low_text)
        high = None if comma and not high_text else int(high_text) if comma else low
        return low, high, end + 1 - self.pos

    def quantified(self, atom: _Node) -> _Node:
        while (c := self.peek()) is not None:
            at = self.pos
            if c in "*+":
                raise self.fail(
                    f"{c!r} repeats without bound, so the language is infinite: use the structural engine "
                    "(xgrammar's compile_regex) for this pattern, or bound it with {m,n}",
                    error=UnboundedPatternError,
                )
            if c == "?":
                low, high, length = 0, 1, 1
            elif c == "{" and (bounds := self.repetition_bounds()) is not None:
                low, maybe_high, length = bounds
                if maybe_high is None:
                    raise self.fail(
                        "'{m,}' repeats without bound, so the language is infinite: use the structural engine "
                        "(xgrammar's compile_regex) for this pattern, or bound it with {m,n}",
                        error=UnboundedPatternError,
                    )
                high = maybe_high
                if high < low:
                    raise self.fail(f"repetition {{{low},{high}}} has its bounds reversed")
            else:
                return atom
            self.pos += length
            if self.peek() == "?":  # lazy: the same language
                self.pos += 1
            elif self.peek() == "+":
                raise self.fail("possessive quantifiers are not supported")
            if low > _MAX_NFA_STATES or high > _MAX_NFA_STATES:
                raise self.fail(f"repetition count {high} is too large", at)
            atom = _Repeat(atom, low, high)
        return atom

    def escape(self, *, in_class: bool) -> tuple[tuple[int, int], ...]:
        at = self.pos
        self.pos += 1
        c = self.peek()
        if c is None:
            raise self.fail("a trailing backslash", at)
        self.pos += 1
        if c in "dws" or c in "DWS":
            ranges = {"d": _DIGIT, "w": _WORD, "s": _SPACE}[c.lower()]
            return _complement(_normalise(ranges)) if c.isupper() else _normalise(ranges)
        if c in _SHORT and not (c == "0" and (self.peek() or "").isdigit()):
            return ((_SHORT[c], _SHORT[c]),)
        if c in "xu":
            digits = 2 if c == "x" else 4
            if c == "u" and self.peek() == "{":
                end = self.pattern.find("}", self.pos)
                text = self.pattern[self.pos + 1 : end] if end > 0 else ""
                self.pos = end + 1 if end > 0 else self.pos
            else:
                text = self.pattern[self.pos : self.pos + digits]
                self.pos += digits
            try:
                point = int(text, 16) if len(text) >= 1 and text.isascii() and text.isalnum() else -1
            except ValueError:
                point = -1
            if not 0 <= point <= _MAX_CODE_POINT:
                raise self.fail(f"malformed escape \\{c}{text}", at)
            return ((point, point),)
        if c.isdigit() or c in "bBAZzkpPG":
            raise self.fail(f"escape \\{c} (backreferences, word boundaries, properties) is not supported", at)
        if c.isalnum():
            raise self.fail(f"unknown escape \\{c}", at)
        return ((ord(c), ord(c)),)  # an escaped punctuation character stands for itself

    def char_class(self) -> _Chars:
        open_at = self.pos
        self.pos += 1
        negate = self.peek() == "^"
        if negate:
            self.pos += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            c = self.peek()
            if c is None:
                raise self.fail("missing ']'", open_at)
            if c == "]" and not first:
                self.pos += 1
                break
            first = False
            item_at = self.pos
            low = self.class_item()
            if self.peek() == "-" and self.pattern[self.pos + 1 : self.pos + 2] not in ("]", ""):
                self.pos += 1
                high = self.class_item()
                if len(low) != 1 or len(high) != 1 or low[0][0] != low[0][1] or high[0][0] != high[0][1]:
                    raise self.fail("a class escape cannot bound a range", item_at)
                if high[0][0] < low[0][0]:
                    raise self.fail("character range out of order", item_at)
                ranges.append((low[0][0], high[0][0]))
            else:
                ranges.extend(low)
        merged = _normalise(ranges)
        return _Chars(_complement(merged) if negate else merged)

    def class_item(self) -> tuple[tuple[int, int], ...]:
        c = self.pattern[self.pos]
        if c == "\\":
            if self.pattern.startswith("\\b", self.pos):  # backspace inside a class
                self.pos += 2
                return ((8, 8),)
            return self.escape(in_class=True)
        self.pos += 1
        return ((ord(c), ord(c)),)


# --------------------------------------------------------------------------- UTF-8


def _utf8_sequences(lo: int, hi: int, out: list[list[tuple[int, int]]]) -> None:
    """Append the byte-range sequences whose concatenations encode exactly the code
    points ``lo..hi`` (no surrogates inside), as in Rust's ``utf8-ranges``."""
    for boundary in (0x7F, 0x7FF, 0xFFFF):  # one encoded length at a time
        if lo <= boundary < hi:
            _utf8_sequences(lo, boundary, out)
            _utf8_sequences(boundary + 1, hi, out)
            return
    if hi < 0x80:
        out.append([(lo, hi)])
        return
    for i in (1, 2, 3):
        m = (1 << (6 * i)) - 1
        if lo & ~m != hi & ~m:
            if lo & m:
                _utf8_sequences(lo, lo | m, out)
                _utf8_sequences((lo | m) + 1, hi, out)
                return
            if hi & m != m:
                _utf8_sequences(lo, (hi & ~m) - 1, out)
                _utf8_sequences(hi & ~m, hi, out)
                return
    first, last = chr(lo).encode("utf-8"), chr(hi).encode("utf-8")
    out.append(list(zip(first, last, strict=True)))


@lru_cache(maxsize=1024)
def _byte_sequences(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[tuple[int, int], ...], ...]:
    out: list[list[tuple[int, int]]] = []
    for lo, hi in ranges:
        for a, b in ((lo, min(hi, 0xD7FF)), (max(lo, 0xE000), hi)):  # surrogates have no UTF-8
            if a <= b:
                _utf8_sequences(a, b, out)
    return tuple(tuple(seq) for seq in out)


# --------------------------------------------------------------------------- automata


class _Nfa:
    """A byte NFA with epsilon moves: ``moves[s]`` lists ``(lo, hi, t)`` byte ranges."""

    def __init__(self, parser: _Parser) -> None:
        self.parser = parser
        self.eps: list[list[int]] = []
        self.moves: list[list[tuple[int, int, int]]] = []

    def state(self) -> int:
        if len(self.eps) >= _MAX_NFA_STATES:
            raise self.parser.fail(_LIMITS["nfa"], 0)
        self.eps.append([])
        self.moves.append([])
        return len(self.eps) - 1

    def build(self, node: _Node, start: int, end: int) -> None:
        """Add ``node`` as a path ``start -> end``."""
        if isinstance(node, _Chars):
            for seq in _byte_sequences(node.ranges):
                at = start
                for i, (lo, hi) in enumerate(seq):
                    following = end if i == len(seq) - 1 else self.state()
                    self.moves[at].append((lo, hi, following))
                    at = following
        elif isinstance(node, _Concat):
            at = start
            for i, part in enumerate(node.parts):
                following = end if i == len(node.parts) - 1 else self.state()
                self.build(part, at, following)
                at = following
            if not node.parts:
                self.eps[start].append(end)
        elif isinstance(node, _Alt):
            for option in node.options:
                self.build(option, start, end)
        else:
            at = start
            for i in range(node.high):
                following = end if i == node.high - 1 else self.state()
                self.build(node.body, at, following)
                if i >= node.low:
                    self.eps[at].append(end)  # the optional copies may be skipped
                at = following
            if node.high == 0:
                self.eps[start].append(end)


def _determinise(nfa: _Nfa, start: int, end: int, parser: _Parser) -> tuple[list[_Row], list[bool]]:
    """Subset construction over byte intervals: per DFA state its transitions and
    whether it accepts."""

    def closure(states: frozenset[int]) -> frozenset[int]:
        stack = list(states)
        seen = set(states)
        while stack:
            for t in nfa.eps[stack.pop()]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return frozenset(seen)

    first = closure(frozenset((start,)))
    ids = {first: 0}
    pending = [first]
    transitions: dict[int, _Row] = {}
    accepting: dict[int, bool] = {}
    closures: dict[frozenset[int], frozenset[int]] = {}
    work = 0
    while pending:
        current = pending.pop()
        moves = [move for s in current for move in nfa.moves[s]]
        work += len(current) + len(moves) * 2
        if work > _MAX_WORK:
            raise parser.fail(_LIMITS["work"], 0)
        cuts = sorted({lo for lo, _, _ in moves} | {hi + 1 for _, hi, _ in moves})
        row: list[tuple[int, int, int]] = []
        for lo, past in pairwise(cuts):  # elementary intervals: every byte in one has the same moves
            raw = frozenset(t for a, b, t in moves if a <= lo and past - 1 <= b)
            if not raw:
                continue
            following = closures.get(raw)
            if following is None:
                following = closures[raw] = closure(raw)
            target = ids.get(following)
            if target is None:
                if len(ids) >= _MAX_DFA_STATES:
                    raise parser.fail(_LIMITS["dfa"], 0)
                target = ids[following] = len(ids)
                pending.append(following)
            if row and row[-1][2] == target and row[-1][1] == lo - 1:
                row[-1] = (row[-1][0], past - 1, target)
            else:
                row.append((lo, past - 1, target))
        index = ids[current]
        transitions[index] = tuple(row)
        accepting[index] = end in current
    count = len(ids)
    return [transitions[i] for i in range(count)], [accepting[i] for i in range(count)]


def _minimise(transitions: list[_Row], accepting: list[bool]) -> ByteDag | None:
    """Revuz's minimisation of an acyclic DFA, then renumbering by level. None when
    the language is empty."""
    n = len(transitions)
    # Height order (children first, by a post-order walk); states are merged when they
    # agree on acceptance and on their (interval, merged target) transitions.
    order: list[int] = []
    state_of = [0] * n  # 0 unvisited, 1 on the stack, 2 done
    for root in range(n):
        if state_of[root]:
            continue
        stack = [(root, iter(transitions[root]))]
        state_of[root] = 1
        while stack:
            node, children = stack[-1]
            for _, _, child in children:
                if state_of[child] == 0:
                    state_of[child] = 1
                    stack.append((child, iter(transitions[child])))
                    break
            else:
                stack.pop()
                state_of[node] = 2
                order.append(node)  # post-order: children before parents
    canonical = [-1] * n
    signatures: dict[tuple[bool, _Row], int] = {}
    for node in order:
        merged: list[tuple[int, int, int]] = []
        for lo, hi, t in transitions[node]:
            target = canonical[t]
            if target < 0:
                continue  # a dead end
            if merged and merged[-1][2] == target and merged[-1][1] == lo - 1:
                merged[-1] = (merged[-1][0], hi, target)
            else:
                merged.append((lo, hi, target))
        if not merged and not accepting[node]:
            continue  # a dead end: nothing is accepted from here
        canonical[node] = signatures.setdefault((accepting[node], tuple(merged)), len(signatures))
    if canonical[0] < 0:
        return None
    # The merged automaton: one state per signature, reachable from the start.
    rows: list[tuple[_Row, bool]] = [((), False)] * len(signatures)
    for (accepts, row), index in signatures.items():
        rows[index] = (row, accepts)
    start = canonical[0]
    # longest distance from the start: relax in topological order (reverse post-order)
    topo: list[int] = []
    seen = {start}
    stack2: list[tuple[int, int]] = [(start, 0)]
    while stack2:
        node, i = stack2.pop()
        row_n = rows[node][0]
        if i < len(row_n):
            stack2.append((node, i + 1))
            child = row_n[i][2]
            if child not in seen:
                seen.add(child)
                stack2.append((child, 0))
        else:
            topo.append(node)
    topo.reverse()
    depth = {start: 0}
    for node in topo:
        for _, _, child in rows[node][0]:
            depth[child] = max(depth.get(child, 0), depth[node] + 1)
    # every signature is reachable from the start: the states are the signatures' ids
    sources: list[int] = []
    bytes_: list[int] = []
    dests: list[int] = []
    for state in topo:
        for lo, hi, child in rows[state][0]:
            sources += [state] * (hi - lo + 1)
            bytes_ += range(lo, hi + 1)
            dests += [child] * (hi - lo + 1)
    level = np.zeros(len(rows), dtype=np.int64)
    level[list(depth)] = list(depth.values())
    source, dest = np.asarray(sources, dtype=np.int64), np.asarray(dests, dtype=np.int64)
    number = canonical_numbering(level, source, np.asarray(bytes_, dtype=np.uint8), dest)
    accept = np.sort(number[[state for state in topo if rows[state][1]]])
    return dag_arrays(len(rows), number[source], bytes_, number[dest], accept, np.bincount(level))


def unanchored(pattern: str) -> str:
    """``pattern`` without a leading ``^`` and a trailing unescaped ``$`` (the same
    language: patterns are anchored), so that it can be embedded in a larger one."""
    if pattern.startswith("^"):
        pattern = pattern[1:]
    body = pattern[:-1]
    if pattern.endswith("$") and (len(body) - len(body.rstrip("\\"))) % 2 == 0:  # not an escaped "$"
        pattern = body
    return pattern


_REFUSED_PATTERNS: BoundedLRU[str, PatternError] = BoundedLRU(1024)  # refusals cost as much as builds
_REFUSED_LOCK = threading.Lock()


def clear_pattern_cache() -> None:
    """Forget the automata and refusals of patterns built so far, and the UTF-8 sequences of
    their character classes: for measurements of a first compile."""
    _dag_of_pattern.cache_clear()
    _byte_sequences.cache_clear()
    with _REFUSED_LOCK:
        _REFUSED_PATTERNS.clear()


def dag_of_pattern(pattern: str) -> ByteDag:
    """The minimal acyclic byte automaton of ``pattern`` (cached, refusals included: it does
    not depend on the vocabulary).

    Raises
    ------
    UnboundedPatternError
        The pattern repeats without bound (its language is infinite).
    PatternError
        The pattern is malformed, uses an unsupported construct, matches nothing,
        or expands beyond the size limits; ``.position`` says where.
    """
    with _REFUSED_LOCK:
        refused = _REFUSED_PATTERNS.get(pattern)
    if refused is not None:
        raise refused.with_traceback(None)
    try:
        return _dag_of_pattern(pattern)
    except PatternError as error:
        with _REFUSED_LOCK:
            _REFUSED_PATTERNS.put(pattern, error)
        raise


@lru_cache(maxsize=256)
def _dag_of_pattern(pattern: str) -> ByteDag:
    parser = _Parser(pattern)
    native = kernels.KERNELS
    if native is not None:  # the same automaton, numbered the same, in C (see _program)
        program = _native_program(native, pattern)
        built = native.pattern_dag(program, _MAX_NFA_STATES, _MAX_DFA_STATES, _MAX_WORK)
        if isinstance(built, str):
            raise parser.fail(_LIMITS[built], 0)
        dag = None if built is None else dag_from_buffers(built)
    else:
        tree = parser.parse()
        nfa = _Nfa(parser)
        start, end = nfa.state(), nfa.state()
        nfa.build(tree, start, end)
        transitions, accepting = _determinise(nfa, start, end, parser)
        dag = _minimise(transitions, accepting)
    if dag is None:
        raise parser.fail("the pattern matches no string", 0)
    return dag


def _native_program(native: Any, pattern: str) -> npt.NDArray[np.int32]:
    """The pattern's program, read by the C kernel (``regex_program``), or by :class:`_Parser`
    where the kernel hands it back: the patterns the reader refuses (its error names the cause
    and the position) and the few forms only it reads. Both read a pattern the same."""
    read = native.regex_program(pattern, _MAX_NFA_STATES)
    if read is not None:
        return np.frombuffer(read, dtype=np.int32)
    program: list[int] = []
    _program(_Parser(pattern).parse(), program)
    return np.asarray(program, dtype=np.int32)


def _program(node: _Node, out: list[int]) -> None:
    """The syntax tree in prefix order, as the C kernel's ``pattern_dag`` reads it: ``0 n (len
    (lo hi)*len)*n`` byte-range sequences, ``1 n part*n`` a concatenation, ``2 n option*n`` an
    alternation, ``3 low high body`` a repetition."""
    if isinstance(node, _Chars):
        sequences = _byte_sequences(node.ranges)
        out += (0, len(sequences))
        for sequence in sequences:
            out.append(len(sequence))
            for low, high in sequence:
                out += (low, high)
    elif isinstance(node, _Repeat):
        out += (3, node.low, node.high)
        _program(node.body, out)
    else:
        children = node.parts if isinstance(node, _Concat) else node.options
        out += (1 if isinstance(node, _Concat) else 2, len(children))
        for child in children:
            _program(child, out)


def literal_alternatives(pattern: str) -> list[str] | None:
    """The strings of a pattern that is an alternation of literals (``yes|no``,
    ``^(?:yes|no)$``, ``slack\\.send|caf\\u00e9``), read by the one regex reader of the
    library; None for anything else (a class, a repetition, a group inside an alternative, a
    malformed pattern): those are languages, compiled as patterns."""
    try:
        node = _Parser(pattern).parse()
    except PatternError:
        return None
    found = []
    for option in node.options if isinstance(node, _Alt) else (node,):
        text = []
        for part in option.parts if isinstance(option, _Concat) else (option,):
            if not isinstance(part, _Chars) or len(part.ranges) != 1:
                return None
            low, high = part.ranges[0]
            if low != high:
                return None
            text.append(chr(low))  # a surrogate too: compiling the set refuses it, naming the value
        found.append("".join(text))
    return found
