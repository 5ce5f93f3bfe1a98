"""Compiler and TrieAutomaton: masks equal the first-principles oracle on real
vocabularies and real value sets; bad input gets typed errors."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest

from conftest import RealVocabulary, byte_vocabulary, real_compiler, real_tokens_by_bytes
from oracle import check_against_oracle
from triemask import (
    DEAD,
    Compiler,
    IncompatibleValueError,
    Matcher,
    StateError,
    TrieAutomaton,
    ValueSetError,
    Vocabulary,
)
from triemask.automata.core import ROW_BY_ROW
from triemask.datasets import load_icd10cm, load_labels, synthetic_tools

VALUE_SETS: dict[str, list[str]] = {
    "synthetic_tools": synthetic_tools(200, seed=3),
    "trec": load_labels("trec"),
    "massive": load_labels("massive"),
    "banking77": load_labels("banking77"),
    "clinc150": load_labels("clinc150"),
    "icd10cm_sample": random.Random(7).sample(load_icd10cm(), 300),
    "unicode_and_emoji": ["café", "naïve", "日本語", "日本", "🦙", "🦙🦙", "👩‍👩‍👧", "Ω", "e\u0301", "Äpfel"],
    "nested_prefixes": ["", "g", "ge", "get", "get_", "get_user", "get_users", "get_user_by_id", "gets"],
    "special_looking": ["<|im_end|>", "<|endoftext|>", "</s>", "<s>", "[INST]", "<0x0A>", "▁hello", "<unk>"],
}


@pytest.mark.parametrize("set_name", sorted(VALUE_SETS))
def test_masks_equal_the_oracle_on_real_vocabularies(real: RealVocabulary, set_name: str) -> None:
    values = VALUE_SETS[set_name]
    automaton = real_compiler(real.name).compile(values)
    encoded = [v.encode() for v in values]
    states = check_against_oracle(
        automaton, real.table, encoded, real.vocab.eos_token_ids, real_tokens_by_bytes(real.name)
    )
    finals = {automaton.value_of(s) for s in states if automaton.is_final(s)}
    assert finals == set(values)  # every value is reachable and completes with EOS
    # the reference tokenization of each value is accepted, then EOS
    eos = real.vocab.eos_token_ids[0]
    for value in values:
        ids = real.encode(value) if value else []
        if real.prefix_space and ids and real.vocab.token_bytes(ids[0]) == b" ":
            ids = ids[1:]  # SentencePiece's dummy-prefix space is a token of its own
        matcher = Matcher(automaton)
        if real.vocab.decode(ids) == value.encode():
            assert matcher.accept_tokens([*ids, eos]) == len(ids) + 1, (value, ids)
            assert matcher.value == value and matcher.is_terminated()


def test_special_token_lookalikes_are_spelled_with_text(qwen_compiler: Compiler, qwen: RealVocabulary) -> None:
    automaton = qwen_compiler.compile(["<|im_end|>", "<|im_start|>user"])
    assert 151645 not in automaton.allowed_token_ids(0).tolist()  # <|im_end|> is EOS, not text
    assert 151644 not in automaton.allowed_token_ids(0).tolist()  # <|im_start|>
    matcher = Matcher(automaton)
    ids = qwen.encode("<|im_end|>")
    assert matcher.accept_tokens(ids) == len(ids) and matcher.value == "<|im_end|>"
    assert matcher.accept_token(151645) and matcher.is_terminated()


def test_compile_options_and_values() -> None:
    compiler = Compiler(byte_vocabulary())
    eos = compiler.vocab.eos_token_ids[0]
    automaton = compiler.compile(iter(["get", "get_user", "get", "", "get_user"]))
    stats = automaton.stats()
    assert stats["values"] == 3 and stats["duplicates_collapsed"] == 2
    assert automaton.values() == ["", "get", "get_user"]  # sorted by UTF-8 bytes
    assert automaton.is_accepting(0) and eos in automaton.allowed_token_ids(0).tolist()  # "" is a value
    state = automaton.next_state(0, 257)  # "get" (token 257 in byte_vocabulary)
    assert automaton.is_accepting(state) and automaton.value_of(state) == "get"
    assert ord("_") in automaton.allowed_token_ids(state).tolist()  # accepts and continues
    final = automaton.next_state(state, eos)
    assert automaton.is_final(final) and automaton.value_of(final) == "get"
    assert automaton.allowed_token_ids(final).size == 0 and automaton.next_state(final, eos) == DEAD
    assert automaton.next_state(0, ord("x")) == DEAD and automaton.value_of(DEAD) is None

    no_eos = compiler.compile(["get", "get_user"], eos=False)
    assert no_eos.eos_token_ids == () and not no_eos.eos
    for state in range(no_eos.num_nodes):
        assert eos not in no_eos.allowed_token_ids(state).tolist()
    leaf = no_eos.next_state(no_eos.next_state(no_eos.next_state(0, 257), ord("_")), 259)  # get _ user
    assert no_eos.value_of(leaf) == "get_user" and no_eos.allowed_token_ids(leaf).size == 0

    as_bytes = compiler.compile([b"\x00\xff", b"get"])  # bytes in, bytes out; NUL is fine
    assert as_bytes.values() == [b"\x00\xff", b"get"]
    state = as_bytes.next_state(as_bytes.next_state(0, 0), 255)
    assert as_bytes.value_of(state) == b"\x00\xff"
    only_empty = compiler.compile([""], eos=False)  # no edges at all
    assert only_empty.value_of(0) == "" and only_empty.allowed_token_ids(0).size == 0
    with_nul = compiler.compile(["a\x00b", "a"])
    assert with_nul.values() == ["a", "a\x00b"]


def test_bad_value_sets_raise_typed_errors() -> None:
    compiler = Compiler(byte_vocabulary())
    with pytest.raises(ValueSetError, match="empty set"):
        compiler.compile([])
    with pytest.raises(ValueSetError, match="single str 'get_user'; wrap it in a list"):
        compiler.compile("get_user")
    with pytest.raises(ValueSetError, match="all str or all bytes; value #1 is bytes: b'b'"):
        compiler.compile(["a", b"b"])  # type: ignore[list-item]
    with pytest.raises(ValueSetError, match="value #2 is int: 3"):
        compiler.compile([b"a", b"b", 3])  # type: ignore[list-item]
    with pytest.raises(ValueSetError, match="value #1 'b\\\\ud800' is not valid Unicode"):
        compiler.compile(["a", "b\ud800"])
    with pytest.raises(ValueSetError, match="needs EOS token ids"):
        Compiler(byte_vocabulary(eos=False)).compile(["a"])
    assert Compiler(byte_vocabulary(eos=False)).compile(["a"], eos=False).num_values == 1
    with pytest.raises(TypeError, match=r"needs a triemask\.Vocabulary"):
        Compiler([b"a"])  # type: ignore[arg-type]


def _small_vocab(tokens: list[bytes]) -> Vocabulary:
    return Vocabulary([*tokens, None], eos_token_ids=len(tokens))


def test_incompatible_values_name_the_value_and_byte() -> None:
    compiler = Compiler(_small_vocab([b"a", b"b", b"ab"]))
    with pytest.raises(
        IncompatibleValueError, match=r"value 'abz' .* byte 0x7a at offset 2 occurs in no text token"
    ) as err:
        compiler.compile(["ab", "abz"])
    assert err.value.value == "abz" and err.value.offset == 2
    compiler = Compiler(_small_vocab([b"a", b"ab", b"cd"]))  # no "b" alone: "b" cannot be spelled
    with pytest.raises(
        IncompatibleValueError, match=r"value 'b' .* longest prefix a token sequence can produce is b''"
    ):
        compiler.compile(["ab", "b"])


def test_dead_ends_are_pruned_when_bytes_are_missing() -> None:
    # "ab" leads to a node from which no token spells "c": only "a" then "bc" completes "abc".
    vocab = _small_vocab([b"a", b"ab", b"bc"])
    automaton = Compiler(vocab).compile(["abc"])
    assert automaton.allowed_token_ids(0).tolist() == [0]
    matcher = Matcher(automaton)
    assert matcher.accept_tokens([0, 2, 3]) == 3 and matcher.value == "abc"


def test_stats_memory_and_pickle(qwen_compiler: Compiler) -> None:
    values = synthetic_tools(1000, seed=0)
    automaton = qwen_compiler.compile(values)
    stats = automaton.stats()
    assert stats["values"] == 1000 and stats["trie_nodes"] == automaton.num_nodes - 1
    assert 0.3 < stats["prefix_sharing_ratio"] < 0.45  # paper: r = 0.40 at K = 1,000
    depth0 = stats["valid_by_depth"][0]
    assert depth0["depth"] == 0 and depth0["nodes"] == 1 and 20 < depth0["max_valid"] < 500
    assert sum(d["nodes"] for d in stats["valid_by_depth"]) == automaton.num_nodes
    assert automaton.memory_bytes == stats["memory_bytes"] > 0
    assert qwen_compiler.stats()["reversed_token_trie_nodes"] > 150000
    clone = pickle.loads(pickle.dumps(automaton))
    assert isinstance(clone, TrieAutomaton) and clone.values() == automaton.values()
    states = np.arange(automaton.num_states)
    assert np.array_equal(
        clone.next_states(states, np.full(len(states), 4)), automaton.next_states(states, np.full(len(states), 4))
    )


def test_automaton_is_immutable_and_rejects_bad_states() -> None:
    automaton = Compiler(byte_vocabulary()).compile(["ab", "b"])
    with pytest.raises(ValueError, match="read-only"):
        automaton.allowed_token_ids(0)[0] = 5
    with pytest.raises(AttributeError):
        automaton.foo = 1  # type: ignore[attr-defined]
    with pytest.raises(StateError, match="state 99 is not a state of this automaton"):
        automaton.next_state(99, 0)
    with pytest.raises(StateError, match="state -2 is not a state"):
        automaton.allowed_token_ids(-2)
    with pytest.raises(StateError, match="integers"):
        automaton.next_states([0.5], [1])
    with pytest.raises(StateError, match="integers"):
        automaton.next_states([0.5] * 20, [1] * 20)
    with pytest.raises(StateError, match="integers"):
        automaton.next_states([0], [1.0])  # a float token is not truncated
    with pytest.raises(IndexError):
        automaton.value(5)


def test_next_states_batch_matches_next_state() -> None:
    compiler = Compiler(byte_vocabulary())
    automaton = compiler.compile(["get_user", "get", "user", "us"])
    rng = np.random.default_rng(0)
    states = rng.integers(-1, automaton.num_states, 500)
    tokens = rng.choice([ord("g"), ord("u"), 257, 258, 259, 263, 264], 500)
    expected = [automaton.next_state(int(s), int(t)) for s, t in zip(states, tokens, strict=True)]
    assert automaton.next_states(states, tokens).tolist() == expected
    for size in (1, 2, ROW_BY_ROW, ROW_BY_ROW + 1):  # the row-by-row and the vectorised paths
        assert automaton.next_states(states[:size], tokens[:size]).tolist() == expected[:size]
        assert automaton.next_states(list(states[:size]), list(tokens[:size])).dtype == np.int32


@pytest.mark.parametrize("native", [True, False])
def test_memory_limit_stops_compilation_with_a_typed_error(native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """max_bytes is checked on the values, on the trie, while matching (the C walk stops at
    the edge budget) and on the result; a budget that fits changes nothing."""
    from triemask import MemoryLimitError
    from triemask.base import kernels as _kernels
    from triemask.datasets import synthetic_tools

    if not native:
        monkeypatch.setattr(_kernels, "KERNELS", None)
    elif _kernels.KERNELS is None:
        pytest.skip("built without the C extension")
    vocab = Vocabulary([bytes([b]) for b in range(256)] + [b"get_", b"user", None], eos_token_ids=258)
    values = synthetic_tools(2_000, seed=1)
    compiler = Compiler(vocab)
    full = compiler.compile(values)
    value_bytes = sum(len(v.encode()) for v in values)
    for limit, stage in (
        (value_bytes // 2, "the values"),
        (value_bytes + 8 * len(values) + 16, "the trie"),
        (full.memory_bytes - 8 * full.stats()["edges"] // 2, "the edges"),
    ):
        with pytest.raises(MemoryLimitError, match=f"for {stage}.*more than max_bytes={limit:,}") as caught:
            compiler.compile(values, max_bytes=limit)
        assert caught.value.limit == limit and caught.value.needed > limit
        assert isinstance(caught.value, ValueSetError)
    with pytest.raises(MemoryLimitError):
        compiler.compile(values, max_bytes=full.memory_bytes - 1)
    fits = compiler.compile(values, max_bytes=full.memory_bytes)
    assert fits.memory_bytes == full.memory_bytes
    assert np.array_equal(
        fits.allowed_token_pairs(range(fits.num_nodes))[1], full.allowed_token_pairs(range(full.num_nodes))[1]
    )
    for bad in (0, -5, "many", 1.5, True):
        with pytest.raises(ValueSetError, match="max_bytes"):
            compiler.compile(values, max_bytes=bad)  # type: ignore[arg-type]
