"""Forced continuations (jump-forward): what ``forced_bytes`` and ``find_jump_forward_string``
answer is the longest common prefix of every continuation of the language from the state,
computed by brute force over the values, on random sets in every layout, updated sets,
patterns and formats, along random token walks; and xgrammar's own answer on the same walks."""

from __future__ import annotations

import json
import random
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import byte_vocabulary
from oracle import strict_json_prefix
from test_schemas import MERGES, SCHEMAS, UNIONS, reference_compiler
from triemask import Compiler, Matcher, StateError
from triemask.automata import whole_characters
from triemask.schemas.matcher import MAX_JUMP_BYTES

VOCAB = byte_vocabulary([b"ge", b"get", b"_us", b"user", b"et", b"er", b"use", b"\xf0\x9f", b"\xc3", b"\xa9a"])
EOS = VOCAB.eos_token_ids[0]


def _common_prefix(strings: list[bytes]) -> bytes:
    if not strings:
        return b""
    low, high = min(strings), max(strings)
    n = next((i for i in range(min(len(low), len(high))) if low[i] != high[i]), min(len(low), len(high)))
    return low[:n]


def _expected(language: list[bytes], prefix: bytes) -> bytes:
    """The brute-force answer: the common prefix of the rests of the strings after ``prefix``."""
    return _common_prefix([v[len(prefix) :] for v in language if v.startswith(prefix)])


def _walks(automaton: Any, language: list[bytes], seed: int, walks: int = 6) -> int:
    """Random token walks (EOS where allowed, now and then); at every state the automaton's and
    the matcher's answers against the brute force. Returns the states checked."""
    rng = random.Random(seed)
    checked = 0
    for _ in range(walks):
        matcher, spelled = Matcher(automaton, max_rollback=0), b""
        while True:
            expected = _expected(language, spelled) if not matcher.is_terminated() else b""
            assert automaton.forced_bytes(matcher.state) == expected, (spelled, expected)
            found = matcher.find_jump_forward_string()
            assert found == (whole_characters(expected) if automaton.values_are_str else expected)
            checked += 1
            allowed = matcher.allowed_token_ids().tolist()
            if not allowed or (EOS in allowed and rng.random() < 0.3):
                break
            token = rng.choice(allowed)
            assert matcher.accept_token(token)
            if token != EOS:
                spelled += VOCAB.token_bytes(token) or b""
    return checked


_PIECES = st.sampled_from(["get", "_", "user", "s", "item", "é", "è", "a", "🦙", "x", "ab", "abc"])
_SETS = st.lists(st.lists(_PIECES, min_size=1, max_size=5).map("".join), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(values=_SETS, layout=st.sampled_from(["trie", "lazy", "dag"]), seed=st.integers(0, 1000))
def test_forced_string_is_the_common_prefix_of_every_continuation(values: list[str], layout: str, seed: int) -> None:
    automaton = Compiler(VOCAB).compile(values, layout=layout)
    assert _walks(automaton, sorted({v.encode() for v in values}), seed) > 0


@settings(max_examples=40, deadline=None)
@given(values=_SETS, added=_SETS, removed=st.lists(st.integers(0, 29), max_size=10), seed=st.integers(0, 1000))
def test_forced_string_of_an_updated_set(values: list[str], added: list[str], removed: list[int], seed: int) -> None:
    compiler = Compiler(VOCAB)
    drop = sorted({values[i % len(values)] for i in removed})
    kept = set(values) - set(drop) | set(added)
    if not kept:
        return
    updated = compiler.compile(values).with_values(added=added, removed=drop, compiler=compiler)
    assert _walks(updated, sorted(v.encode() for v in kept), seed) > 0


@settings(max_examples=30, deadline=None)
@given(values=st.lists(st.binary(min_size=1, max_size=6), min_size=1, max_size=20), seed=st.integers(0, 1000))
def test_forced_bytes_of_a_bytes_set_include_every_byte(values: list[bytes], seed: int) -> None:
    """Bytes values (any byte, 0xff included): the matcher answers bytes, never text."""
    automaton = Compiler(VOCAB).compile(values)
    assert not automaton.values_are_str
    assert _walks(automaton, sorted(set(values)), seed) > 0


@pytest.mark.parametrize(
    "pattern",
    [r"ab(cd|ce)f", r"(foo|bar)baz[0-3]", r"[a-c]{2}x?yz", r"v1\.[0-9]\.(0|1)-rc", r"(é|è)t(é|e)", r"id-[0-9]{3}"],
)
def test_forced_string_of_a_pattern(pattern: str) -> None:
    automaton = Compiler(VOCAB).compile_regex(pattern)
    language = sorted(v.encode() for v in automaton.values())  # (small languages: brute force)
    assert _walks(automaton, language, seed=len(pattern), walks=20) > 20


@pytest.mark.parametrize("name", ["date", "time", "ipv4"])
def test_forced_string_of_a_format_matches_its_shape(name: str) -> None:
    """Formats too large to list: the forced parts are the separators (a date's '-' after the
    year, a time's ':' after the hour)."""
    automaton = Compiler(VOCAB).compile_format(name)
    matcher = Matcher(automaton)
    assert matcher.find_jump_forward_string() == ""
    walked = {"date": b"2024", "time": b"12", "ipv4": b"255"}[name]
    matcher.accept_tokens(list(walked))
    assert matcher.find_jump_forward_string() == {"date": "-", "time": ":", "ipv4": "."}[name]


def test_text_stops_inside_a_character_as_xgrammar_does() -> None:
    automaton = Compiler(VOCAB).compile(["éab", "éac", "èa"])
    matcher = Matcher(automaton)
    assert automaton.forced_bytes(matcher.state) == b"\xc3"
    assert matcher.find_jump_forward_string() == ""  # a lone lead byte is no text
    matcher.accept_token(0xC3)
    assert matcher.find_jump_forward_string() == ""  # inside a character
    matcher.accept_token(0xA9)
    assert matcher.find_jump_forward_string() == "a"
    matcher.accept_token(ord("a"))
    assert matcher.find_jump_forward_string() == ""
    assert whole_characters("aé🦙".encode()[:-1]) == "aé"  # a cut last character is left out


def test_stats_count_the_forced_nodes() -> None:
    for layout in ("trie", "lazy", "dag"):
        automaton = Compiler(VOCAB).compile(["get_user", "get_users", "delete"], layout=layout)
        stats = automaton.stats()
        # forcing: g e t _ u s e (then "r" ends a value), d e l e t (then "e")
        assert stats["forced_nodes"] == 12, (layout, stats["forced_nodes"])


def test_forced_string_agrees_with_xgrammar_on_the_same_walks() -> None:
    """xgrammar's find_jump_forward_string on the alternation of the values, fed the same
    tokens: the same text at every step."""
    xgrammar = pytest.importorskip("xgrammar")
    values = ["get_user", "get_users", "get_item", "delete_user", "delete", "éclair", "èze", "🦙 llama", "🦙 alpaca"]
    table = [VOCAB.token_bytes(i) or b"" for i in range(len(VOCAB))]
    info = xgrammar.TokenizerInfo(
        table, vocab_type=xgrammar.VocabType.RAW, vocab_size=VOCAB.vocab_size, stop_token_ids=[EOS]
    )
    alternation = " | ".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values)
    grammar = xgrammar.GrammarCompiler(info).compile_grammar(f"root ::= {alternation}")
    automaton = Compiler(VOCAB).compile(values)
    rng = random.Random(0)
    for _ in range(40):
        ours, theirs = Matcher(automaton), xgrammar.GrammarMatcher(grammar)
        while not ours.is_terminated():
            assert ours.find_jump_forward_string() == theirs.find_jump_forward_string()
            token = rng.choice(ours.allowed_token_ids().tolist())
            assert ours.accept_token(token) and theirs.accept_token(token)


def test_a_state_from_elsewhere_is_a_typed_error() -> None:
    automaton = Compiler(VOCAB).compile(["ab", "ac"])
    for state in (automaton.num_states, -2, 1.5, "0"):
        with pytest.raises(StateError):
            automaton.forced_bytes(state)  # type: ignore[arg-type]
    assert automaton.forced_bytes(-1) == b""  # DEAD: nothing follows


# --------------------------------------------------------------------------- schemas


def _forced_by_the_language(theirs: Any, text: bytes, eos: int) -> bytes:
    """The whole schema's forced bytes, by brute force: xgrammar's matcher for the whole
    schema probed with each of the 256 bytes on forks; while EOS is refused and exactly one
    byte is accepted (the output staying strict JSON), that byte is forced."""
    probe, forced = theirs.fork(), b""
    while not probe.fork().accept_token(eos):
        viable = [
            b
            for b in range(256)
            if probe.fork().accept_string(bytes([b])) and strict_json_prefix(text + forced + bytes([b]))
        ]
        if len(viable) != 1:
            break
        assert probe.accept_string(bytes(viable))
        forced += bytes(viable)
    return forced


@pytest.mark.parametrize("any_whitespace", [False, True])
@pytest.mark.parametrize(
    "name",
    [
        "tool call",
        "adjacent enums",
        "array and nested",
        "formats and patterns",
        "vLLM tool_choice=required (a union under items)",
        "pydantic discriminated union after an enum field",
    ],
)
def test_forced_string_of_a_schema_is_the_whole_schemas(name: str, any_whitespace: bool) -> None:
    """Across the structure, enum values (tries) and the boundaries between them: the same
    forced text as xgrammar's whole-schema matcher probed byte by byte, at every step of random
    walks; xgrammar's own find_jump_forward_string is never longer."""
    xgrammar = pytest.importorskip("xgrammar")
    tool_call = {
        "type": "object",
        "properties": {
            "name": {"enum": [f"tool_{i:03d}" for i in range(40)] + ["search", "search_all"]},
            "arguments": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query", "limit"],
            },
        },
        "required": ["name", "arguments"],
    }
    schema = {"tool call": tool_call, **SCHEMAS, **UNIONS}[name]
    vocab = byte_vocabulary(MERGES)
    compiled = Compiler(vocab).compile_json_schema(
        schema, any_whitespace=any_whitespace, min_enum_values=2, min_union_branches=2
    )
    reference = reference_compiler(vocab).compile_json_schema(json.dumps(schema), any_whitespace=any_whitespace)
    eos = vocab.eos_token_ids[0]
    rng = random.Random(zlib.crc32(name.encode()))
    jumps = 0
    for _ in range(6):
        ours, theirs = Matcher(compiled), xgrammar.GrammarMatcher(reference)
        for _ in range(40):
            expected = _forced_by_the_language(theirs, ours.text, eos)
            found = ours.find_jump_forward_string()
            assert found == whole_characters(expected), (ours.text, found, expected)
            assert found.startswith(theirs.find_jump_forward_string())
            jumps += bool(found)
            allowed = ours.allowed_token_ids().tolist()
            if not allowed or ours.is_terminated():
                break
            token = rng.choice(allowed)
            assert ours.accept_token(token) and theirs.accept_token(token)
            if token == eos:
                break
    assert jumps >= 10


def test_a_long_forced_const_is_answered_in_bounded_pieces() -> None:
    """A schema forcing a long string: each answer is at most MAX_JUMP_BYTES (a serving step
    stays short) and appending the answers walks the whole forced text."""
    vocab = byte_vocabulary(MERGES)
    long = "x" * (3 * MAX_JUMP_BYTES + 5)
    compiled = Compiler(vocab).compile_json_schema({"const": long}, any_whitespace=False)
    matcher = Matcher(compiled)
    spelled = ""
    while piece := matcher.find_jump_forward_string():
        assert len(piece.encode()) <= MAX_JUMP_BYTES
        assert matcher.accept_tokens(list(piece.encode())) == len(piece.encode())
        spelled += piece
    assert spelled == json.dumps(long)
