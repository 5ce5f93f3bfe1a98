"""Numeric and type edges: every bad argument is a TriemaskError subclass naming the value,
never a silent wrap, truncation or a bare error from deep inside."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from conftest import byte_vocabulary
from triemask import (
    ArgumentTypeError,
    BitmaskError,
    Compiler,
    Matcher,
    StateError,
    TriemaskError,
    ValueIndexError,
    Vocabulary,
    VocabularyError,
    allocate_token_bitmask,
    bitmask_width,
)
from triemask.automata.core import ROW_BY_ROW


@pytest.fixture(scope="module")
def automaton():  # type: ignore[no-untyped-def]
    return Compiler(byte_vocabulary()).compile(["get", "get_user", "us"])


def test_vocab_size_beyond_int32_token_ids_is_refused() -> None:
    with pytest.raises(VocabularyError, match=r"vocab_size=2147483653 exceeds triemask's limit of 2147483648"):
        Vocabulary([b"a", None], eos_token_ids=1, vocab_size=2**31 + 5)


@pytest.mark.parametrize("eos", [1.0, "1", [1.0], [True]])
def test_eos_ids_must_be_integers(eos: object) -> None:
    with pytest.raises(VocabularyError, match="EOS token ids must be"):
        Vocabulary([b"a", None], eos_token_ids=eos)  # type: ignore[arg-type]


@pytest.mark.parametrize("state", [1.5, True, np.bool_(False), "0", None])
def test_states_must_be_integers_everywhere(automaton, state: object) -> None:  # type: ignore[no-untyped-def]
    for query in (
        automaton.is_accepting,
        automaton.is_final,
        automaton.value_of,
        automaton.allowed_token_ids,
        lambda s: automaton.next_state(s, 0),
        lambda s: automaton.next_state(0, s),  # as a token id
        lambda s: automaton.next_states([s], [0]),
        lambda s: automaton.fill_bitmask(allocate_token_bitmask(1, automaton.vocab_size), [s]),
    ):
        with pytest.raises(StateError, match="must be integers"):
            query(state)


def test_numpy_integers_still_work(automaton) -> None:  # type: ignore[no-untyped-def]
    g = automaton.next_state(np.int32(0), np.int64(ord("g")))
    assert g == automaton.next_state(0, ord("g")) and automaton.is_accepting(np.int64(0)) is False


@pytest.mark.parametrize("count", [1, ROW_BY_ROW + 5])  # the row-by-row path and the vectorised one
def test_huge_unsigned_states_are_not_wrapped_to_dead(automaton, count: int) -> None:  # type: ignore[no-untyped-def]
    states = np.full(count, 2**64 - 1, dtype=np.uint64)
    with pytest.raises(StateError, match="18446744073709551615 is not a state"):
        automaton.next_states(states, np.zeros(count, dtype=np.int64))
    with pytest.raises(StateError, match="18446744073709551615 is not a state"):
        automaton.fill_bitmask(allocate_token_bitmask(count, automaton.vocab_size), states)


def test_bool_rows_and_tokens_are_refused(automaton) -> None:  # type: ignore[no-untyped-def]
    bitmask = allocate_token_bitmask(2, automaton.vocab_size)
    with pytest.raises(StateError, match="rows must be integers, got bool True"):
        automaton.fill_bitmask(bitmask, [0], rows=[True])
    with pytest.raises(StateError, match="rows must be"):
        automaton.fill_bitmask(bitmask, [0] * 30, rows=np.ones(30, dtype=bool))
    matcher = Matcher(automaton)
    assert matcher.accept_token(True) is False and matcher.state == 0  # a bool is no token id
    with pytest.raises(StateError, match="row must be an integer, got bool True"):
        matcher.fill_next_token_bitmask(bitmask, row=True)  # type: ignore[arg-type]
    with pytest.raises(StateError, match="num_tokens must be an integer, got bool True"):
        matcher.rollback(True)  # type: ignore[arg-type]
    matcher.fill_next_token_bitmask(bitmask, row=np.int64(1))  # numpy integers are integers
    assert matcher.accept_token(np.int64(ord("g"))) and (matcher.rollback(np.int32(1)) is None)
    assert Matcher(automaton, max_rollback=np.int64(3)).copy() is not None


def test_buffers_and_sizes(automaton) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ArgumentTypeError, match=r"batch_size must be an integer, got float 1\.5"):
        allocate_token_bitmask(1.5, 10)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match=r"vocab_size must be an integer, got float 10\.7"):
        allocate_token_bitmask(1, 10.7)  # type: ignore[arg-type]
    with pytest.raises(BitmaskError):
        allocate_token_bitmask(-1, 10)
    empty = np.zeros((0, allocate_token_bitmask(1, automaton.vocab_size).shape[1]), dtype=np.int32)
    with pytest.raises(StateError, match="1 states but the bitmask has only 0 rows"):
        automaton.fill_bitmask(empty, [0])


def test_constructors_and_indices_raise_triemask_errors(automaton) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ArgumentTypeError, match=r"Compiler needs a triemask\.Vocabulary, got str"):
        Compiler("x")  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="Matcher needs a TrieAutomaton"):
        Matcher(42)  # type: ignore[arg-type]
    for rollback in (-1, 1.5):
        with pytest.raises(StateError, match=r"max_rollback must be an integer in \[0, 2\*\*31\)"):
            Matcher(automaton, max_rollback=rollback)  # type: ignore[arg-type]
    with pytest.raises(ValueIndexError, match=r"value index 3 is outside \[0, 3\)"):
        automaton.value(3)
    with pytest.raises(StateError, match="value indices must be integers"):
        automaton.value(1.5)
    for error in (ArgumentTypeError, ValueIndexError):
        assert issubclass(error, TriemaskError)
    assert issubclass(ArgumentTypeError, TypeError) and issubclass(ValueIndexError, IndexError)


_HOSTILE = [None, "x", 1.5, True, -5, 2**70, [1], [[0]], np.array([[0]]), b"\x00", object(), {"a": 1}, np.float64(1)]


def _public_calls() -> dict[str, object]:
    vocab = Vocabulary([b"a", b"b", b"ab", None], eos_token_ids=3)
    compiler = Compiler(vocab)
    automaton = compiler.compile(["ab", "b"])
    matcher = Matcher(automaton)
    bitmask = allocate_token_bitmask(2, 4)
    return {
        "Vocabulary(token_bytes)": lambda x: Vocabulary(x, eos_token_ids=3),
        "Vocabulary(eos_token_ids)": lambda x: Vocabulary([b"a", None], eos_token_ids=x),
        "Vocabulary(vocab_size)": lambda x: Vocabulary([b"a", None], eos_token_ids=1, vocab_size=x),
        "token_bytes": vocab.token_bytes,
        "decode": vocab.decode,
        "compile": compiler.compile,
        "next_state(state)": lambda x: automaton.next_state(x, 0),
        "next_state(token)": lambda x: automaton.next_state(0, x),
        "next_states(states)": lambda x: automaton.next_states(x, [0]),
        "next_states(tokens)": lambda x: automaton.next_states([0], x),
        "allowed_token_ids": automaton.allowed_token_ids,
        "allowed_token_pairs": automaton.allowed_token_pairs,
        "is_accepting": automaton.is_accepting,
        "is_final": automaton.is_final,
        "value_of": automaton.value_of,
        "value": automaton.value,
        "fill_bitmask(bitmask)": lambda x: automaton.fill_bitmask(x, [0]),
        "fill_bitmask(states)": lambda x: automaton.fill_bitmask(bitmask, x),
        "fill_bitmask(rows)": lambda x: automaton.fill_bitmask(bitmask, [0], rows=x),
        "Matcher": Matcher,
        "Matcher(max_rollback)": lambda x: Matcher(automaton, max_rollback=x),
        "accept_tokens": lambda x: matcher.copy().accept_tokens(x),
        "rollback": lambda x: matcher.copy().rollback(x),
        "fill_next_token_bitmask(bitmask)": matcher.fill_next_token_bitmask,
        "fill_next_token_bitmask(row)": lambda x: matcher.fill_next_token_bitmask(bitmask, x),
        "allocate_token_bitmask(batch_size)": lambda x: allocate_token_bitmask(x, 4),
        "allocate_token_bitmask(vocab_size)": lambda x: allocate_token_bitmask(1, x),
        "bitmask_width": bitmask_width,
        "Compiler": Compiler,
        "from_gguf": Vocabulary.from_gguf,
        "from_sentencepiece": Vocabulary.from_sentencepiece,
        "from_tiktoken": Vocabulary.from_tiktoken,
        "from_huggingface": Vocabulary.from_huggingface,
        "from_mistral": Vocabulary.from_mistral,
        **_pattern_calls(compiler),
        **_schema_calls(),
    }


def _pattern_calls(compiler: Compiler) -> dict[str, object]:
    """Regexes, formats and the DAG automaton's own methods."""
    dag = compiler.compile_regex("(a|b)?ab")
    matcher = Matcher(dag)
    return {
        "compile_regex": compiler.compile_regex,
        "compile_regex(eos)": lambda x: compiler.compile_regex("ab", eos=x),
        "compile_format": compiler.compile_format,
        "compile(layout)": lambda x: compiler.compile(["ab", "b"], layout=x),
        "compile(values, layout=dag)": lambda x: compiler.compile(x, layout="dag"),
        "dag spell": dag.spell,
        "dag value": dag.value,
        "dag value_of": dag.value_of,
        "dag is_accepting": dag.is_accepting,
        "dag next_state": lambda x: dag.next_state(x, 0),
        "dag fill_bitmask(states)": lambda x: dag.fill_bitmask(allocate_token_bitmask(2, 4), x),
        "dag accept_tokens": lambda x: matcher.copy().accept_tokens(x),
        "dag rollback": lambda x: matcher.copy().rollback(x),
    }


def _schema_calls() -> dict[str, object]:
    """The JSON-schema entry points (xgrammar is in the test extra)."""
    import importlib.util

    if importlib.util.find_spec("xgrammar") is None:  # pragma: no cover - make test installs it
        return {}
    from triemask import fill_next_token_bitmasks

    compiler = Compiler(byte_vocabulary())
    schema = {"type": "object", "properties": {"k": {"enum": ["ab", "b"]}}}
    compiled = compiler.compile_json_schema(schema, min_enum_values=2)
    tools = compiler.compile_tools([{"name": "ab"}])
    matcher = Matcher(compiled)
    bitmask = allocate_token_bitmask(2, compiler.vocab.vocab_size)
    return {
        "compile_json_schema": compiler.compile_json_schema,
        "compile_json_schema(any_whitespace)": lambda x: compiler.compile_json_schema(schema, any_whitespace=x),
        "compile_json_schema(indent)": lambda x: compiler.compile_json_schema(schema, indent=x),
        "compile_json_schema(separators)": lambda x: compiler.compile_json_schema(schema, separators=x),
        "compile_json_schema(min_enum_values)": lambda x: compiler.compile_json_schema(schema, min_enum_values=x),
        "compile_tools": compiler.compile_tools,
        "compile_tools(cache_bytes)": lambda x: compiler.compile_tools([{"name": "ab"}], cache_bytes=x),
        "arguments_schema": tools.arguments_schema,
        "schema accept_tokens": lambda x: matcher.copy().accept_tokens(x),
        "schema rollback": lambda x: matcher.copy().rollback(x),
        "schema fill_next_token_bitmask(bitmask)": matcher.fill_next_token_bitmask,
        "schema fill_next_token_bitmask(row)": lambda x: matcher.fill_next_token_bitmask(bitmask, x),
        "fill_next_token_bitmasks(matchers)": lambda x: fill_next_token_bitmasks(x, bitmask),
        "fill_next_token_bitmasks(bitmask)": lambda x: fill_next_token_bitmasks([matcher], x),
        "fill_next_token_bitmasks(rows)": lambda x: fill_next_token_bitmasks([matcher], bitmask, rows=x),
    }


@pytest.mark.parametrize("call", sorted(_public_calls()))
def test_hostile_arguments_get_triemask_errors_only(call: str) -> None:
    """Every public entry point, every kind of wrong argument: a TriemaskError (or a
    plain result), never an error from deep inside numpy or the standard library."""
    function = _public_calls()[call]
    for argument in _HOSTILE:
        with contextlib.suppress(TriemaskError):
            function(argument)  # type: ignore[operator]
