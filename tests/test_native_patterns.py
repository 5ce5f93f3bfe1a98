"""Pattern compiles in C against the NumPy/Python reference: the same minimal automaton, numbered
the same (``pattern_dag``), the same edges (``match_dag``, byte and class matching), the same
refusals, on random patterns and vocabularies and on real ones; and the kernel's checks of what
it is given (never a crash on a malformed program or inconsistent arrays)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import byte_vocabulary, real_vocabulary
from test_regex import patterns, vocabularies
from triemask import FORMATS, Compiler, MemoryLimitError, PatternError, TriemaskError, Vocabulary
from triemask.base import kernels as _kernels
from triemask.sets import regex as _regex

pytestmark = pytest.mark.skipif(not _kernels.NATIVE, reason="built without the C extension")

DAG_FIELDS = ("in_offsets", "source", "byte", "dest", "accepting", "level_offsets")
REAL_PATTERNS = [
    *FORMATS.values(),
    r"\+[1-9][0-9]{6,14}",  # E.164 phone numbers
    r"\(?[0-9]{3}\)?[-. ]?[0-9]{3}[-. ]?[0-9]{4}",
    r"[A-TV-Z][0-9][0-9AB](\.[0-9A-Z]{1,4})?",  # ICD-10-CM codes
    r"(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})(-[0-9A-Za-z]{1,8})?",  # semver
    r"[A-Za-z_][A-Za-z0-9_]{0,7}",
    "x[a-e]{3}é{1,2}|[^a-z]{2}",
]


def outcome(call: Any, *args: Any, **kwargs: Any) -> Any:
    """A call's result, or its error's type and message."""
    try:
        return call(*args, **kwargs)
    except TriemaskError as error:
        return type(error), str(error)


def reference(monkeypatch: pytest.MonkeyPatch, call: Any, *args: Any, **kwargs: Any) -> Any:
    with monkeypatch.context() as patch:
        patch.setattr(_kernels, "KERNELS", None)
        _regex.clear_pattern_cache()
        try:
            return outcome(call, *args, **kwargs)
        finally:
            _regex.clear_pattern_cache()


def same_refusal(mine: Any, theirs: Any) -> None:
    """The same error; for a budget, the same type (the C matching and the reference count the
    same edges and work, but may notice the one or the other first, and stop at other figures)."""
    if mine[0] is MemoryLimitError:
        assert theirs[0] is MemoryLimitError, (mine, theirs)
    else:
        assert mine == theirs


def same_dag(mine: Any, theirs: Any) -> None:
    if isinstance(theirs, tuple):  # an error
        assert mine == theirs
        return
    for name in DAG_FIELDS:
        a, b = getattr(mine, name), getattr(theirs, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name


def same_automaton(mine: Any, theirs: Any) -> None:
    if isinstance(theirs, tuple) or isinstance(mine, tuple):
        assert isinstance(mine, tuple) and isinstance(theirs, tuple), (mine, theirs)
        same_refusal(mine, theirs)
        return
    ours, others = mine._stored_arrays(), theirs._stored_arrays()
    assert ours.keys() == others.keys()
    for name, array in ours.items():
        if isinstance(array, np.ndarray):
            assert array.dtype == others[name].dtype and np.array_equal(array, others[name]), name


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(pattern=patterns(), table=vocabularies(), eos=st.booleans(), budget=st.sampled_from([None, 600, 4_000]))
def test_random_patterns_compile_as_the_reference(
    pattern: tuple[str, int], table: list[bytes | None], eos: bool, budget: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The automaton (numbering included) and the compiled edges, or the same typed error."""
    text = pattern[0]
    _regex.clear_pattern_cache()
    same_dag(outcome(_regex.dag_of_pattern, text), reference(monkeypatch, _regex.dag_of_pattern, text))
    vocab = Vocabulary(table, eos_token_ids=[len(table) - 1], vocab_size=len(table) + 2)
    compiler = Compiler(vocab)
    same_automaton(
        outcome(compiler.compile_regex, text, eos=eos, max_bytes=budget),
        reference(monkeypatch, compiler.compile_regex, text, eos=eos, max_bytes=budget),
    )


def python_program(pattern: str) -> list[int] | None:
    """The reference reader's program (_Parser, _program), or None where it refuses."""
    try:
        tree = _regex._Parser(pattern).parse()
    except PatternError:
        return None
    program: list[int] = []
    _regex._program(tree, program)
    return program


def c_program(pattern: str) -> list[int] | None:
    native = _kernels.KERNELS
    assert native is not None
    read = native.regex_program(pattern, _regex._MAX_NFA_STATES)
    return None if read is None else np.frombuffer(read, dtype=np.int32).tolist()


# every character the reader treats apart, and some it must take as they are
READER_TEXT = [*"ab09_-,:.|()[]{}^$?*+\\\\PdwsDWSxubntrfv<>=!#é", "\x00", "\ud800", "٣", "²", "\U0001f600"]
PIECES = [
    "a", "é", "\U0001f600", "\x00", "]", "}", "{", "{x}", "{,2}", "\\d", "\\W", "\\s", "\\S", "\\n", "\\0-",
    "\\x41", "\\u00e9", "\\u{1F600}", "\\u{0000041}", "\\.", "\\-", "\\\\", "\\{", ".", "[a-c]", "[^a-c\\d]",
    "[]a]", "[^]é-ë]", "[\\b\\x00-\\x1f]", "[a-]", "[-a]", "[\\w.-]", "[\\D]", "[^\\S\\n]",
]  # fmt: skip


@st.composite
def readable_patterns(draw: st.DrawFn, depth: int = 0) -> str:
    """Patterns the reader takes: the pieces above in groups of every kind, alternations
    (empty options too), quantifiers (lazy, stacked), anchors."""
    kind = draw(st.sampled_from(["piece"] if depth >= 3 else ["piece", "piece", "group", "alt", "concat"]))
    if kind == "piece":
        text = draw(st.sampled_from(PIECES))
    elif kind == "group":
        opening = draw(st.sampled_from(["(", "(?:", "(?P<name>", "(?<n_1>"]))
        text = opening + draw(readable_patterns(depth + 1)) + ")"
    elif kind == "alt":
        text = "|".join(draw(st.lists(readable_patterns(depth + 1) | st.just(""), min_size=2, max_size=3)))
        text = "(?:" + text + ")"
    else:
        text = "".join(draw(st.lists(readable_patterns(depth + 1), min_size=0, max_size=3)))
    if text and text[-1] not in "|(" and draw(st.booleans()):
        low = draw(st.integers(0, 3))
        quantifier = draw(st.sampled_from(["?", f"{{{low}}}", f"{{{low},{low + draw(st.integers(0, 2))}}}"]))
        text = "(?:" + text + ")" + quantifier + draw(st.sampled_from(["", "?"]))
    if depth == 0:
        text = draw(st.sampled_from(["", "^"])) + text + draw(st.sampled_from(["", "$"]))
    return text


@pytest.mark.skipif(_kernels.KERNELS is None, reason="the C extension is not built")
@settings(max_examples=600, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(READER_TEXT), max_size=24))
def test_the_c_reader_reads_random_text_as_the_reference(text: str) -> None:
    """Whatever the C reader reads, the reference reads the same; what it refuses or hands
    back (None), the reference reads or refuses itself (with its error and position)."""
    mine = c_program(text)
    if mine is not None:
        assert mine == python_program(text)


@pytest.mark.skipif(_kernels.KERNELS is None, reason="the C extension is not built")
@settings(max_examples=400, deadline=None)
@given(text=readable_patterns())
def test_the_c_reader_reads_what_the_reference_reads(text: str) -> None:
    mine, theirs = c_program(text), python_program(text)
    assert theirs is not None, text
    assert mine == theirs, text


@pytest.mark.skipif(_kernels.KERNELS is None, reason="the C extension is not built")
def test_the_c_reader_reads_every_real_pattern_and_hands_back_the_rest() -> None:
    for pattern in REAL_PATTERNS:
        assert c_program(pattern) == python_program(pattern) and c_program(pattern) is not None, pattern
    # forms only the reference reads: the pattern reads all the same, through it (\0 before a
    # non-ASCII character too: the reference asks str.isdigit of it)
    assert c_program("\\0é") is None and python_program("\\0é") is not None
    for pattern, language in [("\\u{0x41}", {"A"}), ("b\\x4", {"b\x04"}), ("a{1,1234567890}", None)]:
        assert c_program(pattern) is None
        if language is None:
            with pytest.raises(PatternError, match="too large"):
                _regex.dag_of_pattern(pattern)
        else:
            assert Compiler(byte_vocabulary()).compile_regex(pattern).values() == sorted(language)
    # (ASCII digits only in bounds, as Python's re: once a ValueError from int("²"))
    assert python_program("a{1,²}") == c_program("a{1,²}") is not None


@pytest.mark.parametrize("name", ["qwen2", "mistral-spm-32k", "o200k_base"])
def test_real_patterns_compile_as_the_reference(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Formats and real-world patterns on real vocabularies (duplicate tokens in SentencePiece's
    byte fallback); the byte and class matchings agree whichever the kernel would choose."""
    compiler = Compiler(real_vocabulary(name).vocab)
    native = _kernels.KERNELS
    assert native is not None
    for pattern in REAL_PATTERNS:
        same_automaton(compiler.compile_regex(pattern), reference(monkeypatch, compiler.compile_regex, pattern))
        dag = _regex.dag_of_pattern(pattern)
        eos = np.asarray(compiler.vocab.eos_token_ids, dtype=np.int64)
        tables = compiler._index.native_tables()
        answers = [
            native.match_dag(
                tables,
                dag.in_offsets,
                dag.source,
                dag.byte,
                dag.accepting,
                eos,
                compiler.vocab.vocab_size,
                -1,
                -1,
                mode,
            )
            for mode in (0, 1, 2)
        ]
        assert answers[0] == answers[1] == answers[2], pattern


@pytest.mark.parametrize("pattern", ["(.{0,50}){0,50}", "[ab]{0,30}a[ab]{30}", "((a{100}){100}){19}", "a{50001}"])
def test_refusals_are_the_reference_refusals(pattern: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _regex.clear_pattern_cache()
    mine = outcome(_regex.dag_of_pattern, pattern)
    assert mine == reference(monkeypatch, _regex.dag_of_pattern, pattern)
    assert mine[0] is PatternError


def test_budgets_stop_the_native_matching(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pattern whose edges pass max_bytes is refused by the C matching as by the reference."""
    compiler = Compiler(real_vocabulary("qwen2").vocab)
    for pattern, limit in [(r"[A-Za-z]{1,12}", 200_000), (FORMATS["uuid"], 20_000)]:
        mine = outcome(compiler.compile_regex, pattern, max_bytes=limit)
        assert mine[0] is MemoryLimitError and "max_bytes=" in mine[1]
        assert reference(monkeypatch, compiler.compile_regex, pattern, max_bytes=limit)[0] is MemoryLimitError


@settings(max_examples=300, deadline=None)
@given(program=st.lists(st.integers(-3, 300), max_size=40))
def test_malformed_programs_are_value_errors(program: list[int]) -> None:
    """pattern_dag reads any int32 array without reading past it: a malformed program is a
    ValueError, a well-formed one an automaton, an empty language None, or a limit's name."""
    native = _kernels.KERNELS
    assert native is not None
    try:
        answer = native.pattern_dag(np.asarray(program, dtype=np.int32), 64, 64, 10_000)
    except ValueError as error:
        assert "malformed" in str(error)
    else:
        assert answer is None or answer in ("nfa", "dfa", "work") or len(answer) == 6


def test_match_dag_checks_its_arrays() -> None:
    native = _kernels.KERNELS
    assert native is not None
    compiler = Compiler(real_vocabulary("qwen2").vocab)
    tables = compiler._index.native_tables()
    dag = _regex.dag_of_pattern("[0-9]{2}")
    eos = np.zeros(0, dtype=np.int64)
    good = [dag.in_offsets, dag.source, dag.byte, dag.accepting, eos]
    size = compiler.vocab.vocab_size
    assert isinstance(native.match_dag(tables, *good, size, -1, -1, 0), tuple)
    cyclic = dag.source.copy()
    cyclic[-1] = dag.num_nodes - 1  # an edge into its own source: not acyclic
    bad: list[list[Any]] = [
        [dag.in_offsets[:-1], *good[1:]],
        [good[0], cyclic, *good[2:]],
        [*good[:3], np.array([dag.num_nodes], dtype=np.int32), eos],
        [*good[:4], np.array([size], dtype=np.int64)],
    ]
    for arrays in bad:
        with pytest.raises(ValueError, match="inconsistent"):
            native.match_dag(tables, *arrays, size, -1, -1, 0)
    with pytest.raises(ValueError):
        native.match_dag(tables, *good, size, -1, -1, 3)
    assert native.match_dag(tables, *good, size, 0, -1, 0) == "edges"
    words = _regex.dag_of_pattern("[a-z]{3}")  # (Qwen2 spells digits one by one: the walk above never climbs)
    climbing = [words.in_offsets, words.source, words.byte, words.accepting, eos]
    assert native.match_dag(tables, *climbing, size, -1, 0, 0) == "work"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.text(alphabet="ab-é\x00", max_size=6), min_size=1, max_size=20))
def test_set_dags_equal_the_reference(values: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """dag_of_trie in C merges and numbers the nodes of a set's trie as the NumPy reference does."""
    from triemask.base import build_trie, dag_of_trie
    from triemask.base.values import encode_values

    _, strings, flat, starts, _ = encode_values(values)
    trie = build_trie(flat, starts, strings=strings)
    mine = dag_of_trie(trie)
    same_dag(mine, reference(monkeypatch, dag_of_trie, trie))
    assert mine.language_size() == len(set(values))


def test_real_set_dags_equal_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    from triemask.datasets import load_icd10cm, synthetic_tools

    compiler = Compiler(real_vocabulary("qwen2").vocab)
    for values in (load_icd10cm()[:20_000], synthetic_tools(5_000)):
        same_automaton(
            compiler.compile(values, layout="dag"), reference(monkeypatch, compiler.compile, values, layout="dag")
        )


def test_dag_of_trie_checks_its_trie() -> None:
    native = _kernels.KERNELS
    assert native is not None
    parent = np.array([0, 0, 0, 1], dtype=np.int32)
    byte = np.array([0, 97, 98, 99], dtype=np.uint8)
    terminal = np.array([3, 2], dtype=np.int32)
    assert len(native.dag_of_trie(parent, byte, terminal)) == 6
    for bad in (
        (np.array([0, 0, 0, 3], dtype=np.int32), byte, terminal),  # a parent after its child
        (np.array([0, 1, 0, 1], dtype=np.int32), byte, terminal),  # parents out of order
        (parent, np.array([0, 98, 97, 99], dtype=np.uint8), terminal),  # siblings out of byte order
        (parent, byte, np.array([4], dtype=np.int32)),  # a terminal outside the trie
        (parent, byte[:3], terminal),
    ):
        with pytest.raises(ValueError, match="breadth-first trie"):
            native.dag_of_trie(*bad)


@pytest.mark.parametrize("merges", [[], [b"ab", b"\xc3", b"a\xc3\xa9", b"\x00\xff", b'"\\', b"\n\r"]])
def test_every_byte_a_token_compiles_as_the_reference(merges: list[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every byte a token (NUL, controls, quotes, backslash, bytes no UTF-8 text holds): the C
    matching assumes no byte away, whatever the classes (any character, negations, escapes)."""

    compiler = Compiler(byte_vocabulary(merges))
    for pattern in [".{0,2}", "[^a]{1,2}", "\\s\\S", '[\\x00-\\x1f"\\\\]{1,3}', "\\w{2}é?", FORMATS["ipv4"]]:
        same_automaton(compiler.compile_regex(pattern), reference(monkeypatch, compiler.compile_regex, pattern))
