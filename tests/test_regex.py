"""Finite regexes and formats: masks against a first-principles oracle (the language
enumerated with Python's ``re``), random patterns and vocabularies (hypothesis),
xgrammar's masks on real vocabularies, and typed errors."""

from __future__ import annotations

import copy
import itertools
import pickle
import random
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import byte_vocabulary, real_compiler, real_vocabulary
from oracle import Oracle, bitmask_tokens
from triemask import (
    DEAD,
    FORMATS,
    ArgumentTypeError,
    Compiler,
    DagAutomaton,
    IncompatibleValueError,
    Matcher,
    PatternError,
    StateError,
    TrieAutomaton,
    UnboundedPatternError,
    ValueIndexError,
    ValueSetError,
    Vocabulary,
    allocate_token_bitmask,
)

ALPHABET = "ab-é"  # é is two UTF-8 bytes: multi-byte characters inside the automaton


def language(pattern: str, max_length: int, alphabet: str = ALPHABET) -> list[bytes]:
    """Every string over ``alphabet`` up to ``max_length`` characters that Python's ``re``
    matches in full: the oracle's language, computed without triemask."""
    compiled = re.compile(pattern, re.DOTALL)
    return [
        "".join(chars).encode()
        for length in range(max_length + 1)
        for chars in itertools.product(alphabet, repeat=length)
        if compiled.fullmatch("".join(chars))
    ]


def check_language(automaton: DagAutomaton, table: list[bytes | None], strings: list[bytes]) -> int:
    """Walk every token path of the automaton, comparing each state's mask with the
    oracle's for the bytes consumed so far; returns the number of paths' states seen."""
    eos = list(automaton.eos_token_ids) or [len(table) - 1]
    oracle = Oracle(table, strings, eos)
    bitmask = allocate_token_bitmask(1, automaton.vocab_size)
    matcher = Matcher(automaton, max_rollback=64)
    seen = 0
    stack: list[tuple[int, bytes, list[int]]] = [(automaton.initial_state, b"", [])]
    while stack:
        state, prefix, tokens = stack.pop()
        seen += 1
        expected = set() if automaton.is_final(state) else oracle.allowed(prefix, eos=automaton.eos)
        assert set(automaton.allowed_token_ids(state).tolist()) == expected, (automaton.pattern, prefix)
        automaton.fill_bitmask(bitmask, [state])
        assert bitmask_tokens(bitmask[0], automaton.vocab_size) == expected
        assert automaton.is_accepting(state) == (automaton.is_final(state) or prefix in oracle.values)
        matcher.reset()
        assert matcher.accept_tokens(tokens) == len(tokens) and matcher.state == state
        assert matcher.value == (prefix.decode() if automaton.is_accepting(state) else None)
        for token in expected:
            following = automaton.next_state(state, token)
            assert following != DEAD
            if not automaton.is_final(following):
                stack.append((following, prefix + (table[token] or b""), [*tokens, token]))
    return seen


CASES = [
    ("a?b", 2),
    ("(ab|a|b-){1,2}", 6),
    ("[a-b]{2}-(é|a)", 4),
    ("(a|é){0,3}", 3),
    ("é|[à-é]b?", 2),  # the oracle's alphabet below holds à..é
    ("^a{2}$", 2),
    ("(?:ab)?(?P<x>-)", 3),
    ("", 0),
    ("a|", 1),
    ("[\\-ab]{1,2}", 2),
    ("\\x61\\u00e9", 2),
    ("[ab]{0}b", 1),
]


@pytest.mark.parametrize(("pattern", "max_length"), CASES)
@pytest.mark.parametrize("merges", [[], [b"ab", b"b-", b"\xc3", b"a\xc3\xa9", b"-a", b"aa"]])
def test_masks_equal_the_oracle(pattern: str, max_length: int, merges: list[bytes]) -> None:
    vocab = byte_vocabulary(merges)
    table = [vocab.token_bytes(i) for i in range(vocab.vocab_size)]
    automaton = Compiler(vocab).compile_regex(pattern)
    strings = language(pattern, max_length, ALPHABET + ("àáâãäåæçè" if "à" in pattern else ""))
    assert check_language(automaton, table, strings) > 0
    # the language itself: its size and every string, in byte order
    assert automaton.num_values == len(strings)
    assert automaton.values() == sorted(s.decode() for s in strings)


def test_vocabularies_missing_bytes_prune_dead_ends() -> None:
    # no single "b" token: "ab" is reachable only through "ab"; "b-" only through "b-"
    table: list[bytes | None] = [b"a", b"ab", b"-", b"b-", None]
    vocab = Vocabulary(table, eos_token_ids=[4])
    automaton = Compiler(vocab).compile_regex("(a|b){1,2}-?")
    check_language(automaton, table, language("(a|b){1,2}-?", 3))
    with pytest.raises(IncompatibleValueError, match="no string of"):
        Compiler(vocab).compile_regex("b")


@st.composite
def patterns(draw: st.DrawFn, depth: int = 0) -> tuple[str, int]:
    """A random finite pattern over ``ALPHABET`` and the length of its longest string."""
    kind = draw(st.sampled_from(["char", "class"] if depth >= 2 else ["char", "class", "concat", "alt", "repeat"]))
    if kind == "char":
        c = draw(st.sampled_from(ALPHABET))
        return ("\\-" if c == "-" else c), 1
    if kind == "class":
        chars = draw(st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=3, unique=True))
        return "[" + "".join("\\-" if c == "-" else c for c in chars) + "]", 1
    if kind in ("concat", "alt"):
        parts = draw(st.lists(patterns(depth + 1), min_size=2, max_size=3))
        if kind == "concat":
            return "".join(f"(?:{p})" for p, _ in parts), sum(n for _, n in parts)
        return "|".join(p for p, _ in parts), max(n for _, n in parts)
    body, n = draw(patterns(depth + 1))
    low = draw(st.integers(0, 2))
    high = draw(st.integers(max(low, 1), 2))
    quantifier = draw(st.sampled_from(["?", f"{{{low},{high}}}", f"{{{high}}}"]))
    bounds = {"?": 1, f"{{{high}}}": high}.get(quantifier, high)
    return f"(?:{body}){quantifier}", n * bounds


@st.composite
def vocabularies(draw: st.DrawFn) -> list[bytes | None]:
    """Random token tables over the alphabet's bytes: maybe every single byte, random
    merges, a non-text id, EOS last."""
    pieces = sorted({b for c in ALPHABET for b in c.encode()})
    merges = st.lists(st.sampled_from(pieces), min_size=1, max_size=4).map(bytes)
    table: list[bytes | None] = []
    if draw(st.booleans()):
        table += [bytes([b]) for b in pieces]
    table += draw(st.lists(merges, min_size=1, max_size=12))
    table += [None] * draw(st.integers(0, 1))
    draw(st.randoms(use_true_random=False)).shuffle(table)
    table.append(None)
    return table


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=patterns(), table=vocabularies(), eos=st.booleans())
def test_random_patterns_and_vocabularies(pattern: tuple[str, int], table: list[bytes | None], eos: bool) -> None:
    text, longest = pattern
    strings = language(text, min(longest, 6))
    if longest > 6:
        return  # the brute-force oracle enumerates up to 4**6 strings
    vocab = Vocabulary(table, eos_token_ids=[len(table) - 1], vocab_size=len(table) + 2)
    try:
        automaton = Compiler(vocab).compile_regex(text, eos=eos)
    except IncompatibleValueError:
        oracle = Oracle(table, strings, [len(table) - 1])
        assert not any(s in oracle.live and s in oracle.values for s in strings) or not oracle.allowed(b"")
        return
    check_language(automaton, table, strings)
    if automaton.num_values <= 200:
        assert automaton.values() == sorted(s.decode() for s in strings)


def test_formats_are_the_documented_languages() -> None:
    vocab = byte_vocabulary()
    compiler = Compiler(vocab)
    date = compiler.compile_format("date")
    assert date.num_values == 10_000 * (9 + 3) * (9 + 20 + 2)
    assert (date.value(0), date.value(date.num_values - 1)) == ("0000-01-01", "9999-12-31")
    # xgrammar's language: an octet may carry leading zeros (310 + 50 + 6 spellings)
    assert compiler.compile_format("ipv4").num_values == 366**4
    uuid = compiler.compile_format("uuid")
    assert uuid.num_values == 22**32 and re.fullmatch(FORMATS["uuid"], uuid.value(123_456_789_123))
    rng = random.Random(0)
    for name in FORMATS:
        automaton = compiler.compile_format(name)
        for _ in range(50):  # random members spell back through the matcher
            text = automaton.value(rng.randrange(automaton.num_values))
            assert re.fullmatch(FORMATS[name], text), (name, text)
            matcher = Matcher(automaton)
            assert matcher.accept_tokens(text.encode()) == len(text.encode())
            assert matcher.value == text and automaton.spell(list(text.encode())) == text
            assert matcher.accept_token(vocab.eos_token_ids[0]) and matcher.is_terminated()
    assert Matcher(date).accept_tokens(b"2024-13-01") == 6  # month 13 stops at its second digit
    with pytest.raises(ValueSetError, match="built-in formats are date"):
        compiler.compile_format("email")


def test_dag_automaton_interface() -> None:
    vocab = byte_vocabulary([b"20", b"24", b"-0", b"1-"])
    automaton = Compiler(vocab).compile_format("date")
    assert isinstance(automaton, TrieAutomaton) and automaton.pattern == FORMATS["date"]
    stats = automaton.stats()
    assert stats["values"] == 3_720_000 and stats["dag_nodes"] == automaton.num_nodes == 14
    clone = pickle.loads(pickle.dumps(automaton))
    assert clone.num_values == automaton.num_values and clone.memory_bytes == automaton.memory_bytes
    matcher = Matcher(automaton)
    tokens = [vocab.token_bytes(i) for i in range(vocab.vocab_size)].index(b"20")
    matcher.accept_tokens([tokens, *b"24-0", *b"2-29"])
    assert matcher.value == "2024-02-29"
    forked = copy.copy(matcher)
    matcher.rollback(2)
    assert matcher.value is None and forked.value == "2024-02-29"
    assert pickle.loads(pickle.dumps(forked)).value == "2024-02-29"
    matcher.reset()
    assert matcher.value is None and matcher.state == 0
    with pytest.raises(StateError, match="spell"):
        automaton.value_of(0)
    with pytest.raises(ValueIndexError):
        automaton.value(automaton.num_values)
    with pytest.raises(ValueSetError, match="value\\(i\\)"):
        automaton.values()
    states = np.array([0, 1, automaton.num_nodes, DEAD])
    rows, tokens_out = automaton.allowed_token_pairs(states)
    assert set(rows.tolist()) <= {0, 1} and tokens_out.size == sum(automaton.allowed_token_ids(s).size for s in states)
    # eos=False: nothing ends the output but the pattern itself
    no_eos = Compiler(vocab).compile_regex("ab?", eos=False)
    after_a = no_eos.next_state(0, ord("a"))
    assert no_eos.is_accepting(after_a) and list(no_eos.allowed_token_ids(after_a)) == [ord("b")]


@pytest.mark.parametrize(
    ("pattern", "position", "error"),
    [
        ("a*", 1, UnboundedPatternError),
        ("(ab)+", 4, UnboundedPatternError),
        ("a{2,}", 1, UnboundedPatternError),
        ("\\d{4}-x*", 7, UnboundedPatternError),
        ("(ab", 0, PatternError),
        ("ab)", 2, PatternError),
        ("[ab", 0, PatternError),
        ("[b-a]", 1, PatternError),
        ("a{3,2}", 1, PatternError),
        ("*a", 0, PatternError),
        ("a|?", 2, PatternError),
        ("(?=a)b", 1, PatternError),
        ("(a)\\1", 3, PatternError),
        ("a\\", 1, PatternError),
        ("\\q", 0, PatternError),
        ("\\xZZ", 0, PatternError),
        ("a^b", 1, PatternError),
        ("a{99999999}", 1, PatternError),
        ("((a{100}){100}){100}", 0, PatternError),
        ("[^\\x00-\\u{10ffff}]", 0, PatternError),
    ],
)
def test_bad_patterns_are_typed_errors_with_a_position(pattern: str, position: int, error: type) -> None:
    compiler = Compiler(byte_vocabulary())
    with pytest.raises(error) as info:
        compiler.compile_regex(pattern)
    assert info.value.position == position and info.value.pattern == pattern
    assert f"position {position}" in str(info.value)
    if error is UnboundedPatternError:
        assert "structural engine" in str(info.value)


def test_non_string_patterns_and_names() -> None:
    compiler = Compiler(byte_vocabulary())
    with pytest.raises(ArgumentTypeError):
        compiler.compile_regex(b"ab")  # type: ignore[arg-type]
    with pytest.raises(ValueSetError):
        compiler.compile_format(3)  # type: ignore[arg-type]


def test_wide_classes_spell_every_character() -> None:
    compiler = Compiler(byte_vocabulary())
    assert compiler.compile_regex(".").num_values == 0x110000 - 0x800  # all but the surrogates
    assert compiler.compile_regex("[^a]").num_values == 0x110000 - 0x800 - 1
    assert compiler.compile_regex("\\w").num_values == 63 and compiler.compile_regex("\\d").num_values == 10
    spaces = compiler.compile_regex("\\s")
    assert spaces.values() == sorted(
        [chr(c) for c in (9, 10, 11, 12, 13, 32, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000, 0xFEFF)]
        + [chr(c) for c in range(0x2000, 0x200B)],
        key=str.encode,
    )
    emoji = compiler.compile_regex("[😀-😂]{2}")
    assert emoji.num_values == 9 and emoji.value(0) == "😀😀"


@pytest.mark.parametrize("name", ["qwen2", "mistral-spm-32k", "o200k_base"])
def test_formats_equal_xgrammar_regex_masks(name: str) -> None:
    xgr = pytest.importorskip("xgrammar")
    vocab = real_vocabulary(name).vocab
    encoded = [vocab.token_bytes(i) or f"<|special_{i}|>".encode() for i in range(len(vocab))]
    info = xgr.TokenizerInfo(
        encoded, xgr.VocabType.RAW, vocab_size=vocab.vocab_size, stop_token_ids=list(vocab.eos_token_ids)
    )
    grammars = xgr.GrammarCompiler(info, cache_enabled=False)
    mine = allocate_token_bitmask(1, vocab.vocab_size)
    theirs = xgr.allocate_token_bitmask(1, vocab.vocab_size).numpy()
    rng = random.Random(7)
    for fmt, pattern in FORMATS.items():
        automaton = real_compiler(name).compile_format(fmt)
        compiled = grammars.compile_regex(pattern)
        for _ in range(12):
            matcher, state = xgr.GrammarMatcher(compiled), automaton.initial_state
            while not automaton.is_final(state):
                automaton.fill_bitmask(mine, [state])
                matcher.fill_next_token_bitmask(theirs)
                assert np.array_equal(mine, theirs), (name, fmt, state)
                token = rng.choice(automaton.allowed_token_ids(state).tolist())
                assert matcher.accept_token(token)
                state = automaton.next_state(state, token)


SETS = [
    ["get_user", "get_users", "set_user", "set_users", "delete_user"],
    ["A00.0", "A00.1", "A00.9", "B01.0", "B01.1", "B01.9", "B02", ""],
    ["naïve", "café", "é", "ée", "a"],
]


@pytest.mark.parametrize("values", SETS)
@pytest.mark.parametrize("merges", [[], [b"get", b"_user", b"s", b"A00", b".0", b"\xc3\xa9e", b"user"]])
@pytest.mark.parametrize("eos", [True, False])
def test_set_dag_layout_equals_the_trie(values: list[str], merges: list[bytes], eos: bool) -> None:
    vocab = byte_vocabulary(merges)
    table = [vocab.token_bytes(i) for i in range(vocab.vocab_size)]
    compiler = Compiler(vocab)
    dag = compiler.compile(values, eos=eos, layout="dag")
    trie = compiler.compile(values, eos=eos)
    assert isinstance(dag, DagAutomaton) and dag.pattern is None and dag.num_nodes < trie.num_nodes
    assert dag.values() == trie.values() and dag.num_values == trie.num_values
    check_language(dag, table, [v.encode() for v in values])
    # the same masks along every token path of the trie
    stack = [(trie.initial_state, dag.initial_state)]
    while stack:
        t, d = stack.pop()
        assert trie.allowed_token_ids(t).tolist() == dag.allowed_token_ids(d).tolist()
        stack.extend((trie.next_state(t, x), dag.next_state(d, x)) for x in trie.allowed_token_ids(t).tolist())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    values=st.lists(st.text(alphabet=ALPHABET, max_size=6), min_size=1, max_size=12),
    table=vocabularies(),
)
def test_random_sets_in_the_dag_layout(values: list[str], table: list[bytes | None]) -> None:
    vocab = Vocabulary(table, eos_token_ids=[len(table) - 1])
    try:
        trie = Compiler(vocab).compile(values)
    except IncompatibleValueError as error:
        with pytest.raises(IncompatibleValueError) as again:
            Compiler(vocab).compile(values, layout="dag")
        assert again.value.value == error.value
        return
    dag = Compiler(vocab).compile(values, layout="dag")
    check_language(dag, table, [v.encode() for v in values])
    assert dag.values() == trie.values()


def test_set_layout_errors() -> None:
    compiler = Compiler(byte_vocabulary())
    with pytest.raises(ValueSetError, match="layout must be"):
        compiler.compile(["a"], layout="graph")
    with pytest.raises(ValueSetError, match="str values"):
        compiler.compile([b"a"], layout="dag")


@pytest.mark.parametrize("name", ["qwen2", "mistral-spm-32k"])
def test_class_matching_equals_byte_matching(name: str) -> None:
    """Automata with interchangeable bytes (hex digits) are matched once per class string;
    the edges must be exactly those of matching byte by byte."""
    from triemask.sets.matching import EdgeKeys, match_dag, match_dag_by_class
    from triemask.sets.regex import dag_of_pattern
    from triemask.vocab.token_index import TokenIndex

    index = TokenIndex(real_vocabulary(name).vocab)
    for pattern in [FORMATS["uuid"], FORMATS["ipv6"], "[a-f0-9]{2,6}(-[A-F]{3})?", "x[a-e]{3}é{1,2}"]:
        dag = dag_of_pattern(pattern)
        keys = EdgeKeys(dag.num_nodes, dag.num_nodes + len(dag.accepting), index.vocab.vocab_size)
        by_class = match_dag_by_class(dag, index, keys)
        assert by_class is not None, pattern  # these patterns take the class path
        expected = np.sort(np.concatenate(match_dag(dag, index, keys)))
        assert np.array_equal(np.sort(np.concatenate(by_class)), expected), pattern


@pytest.mark.parametrize("pattern", ["(.{0,50}){0,50}", "[ab]{0,30}a[ab]{30}", "((a{100}){100}){19}"])
def test_hostile_patterns_are_refused_quickly(pattern: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Patterns whose automaton is costly to build (large subsets, exponential DFAs, deep
    repetition) are a PatternError at admission: the work is bounded, not just the states;
    and the refusal is remembered, not built again for the engine or the next request."""
    from triemask.sets import regex as _regex

    _regex.clear_pattern_cache()
    builds = []
    build = _regex._dag_of_pattern
    monkeypatch.setattr(_regex, "_dag_of_pattern", lambda p: builds.append(p) or build(p))
    for _ in range(3):
        with pytest.raises(PatternError, match="more than"):
            _regex.dag_of_pattern(pattern)
    assert builds == [pattern]
