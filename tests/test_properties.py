"""Property-based tests: random byte vocabularies x random value sets."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import real_compiler, real_tokens_by_bytes, real_vocabulary
from oracle import Oracle, check_against_oracle
from triemask import DEAD, Compiler, IncompatibleValueError, Matcher, Vocabulary

ALPHABET = b"abc\x00\xff"
byte_strings = st.binary(min_size=0, max_size=6).map(lambda b: bytes(ALPHABET[x % len(ALPHABET)] for x in b))
tokens = st.binary(min_size=1, max_size=4).map(lambda b: bytes(ALPHABET[x % len(ALPHABET)] for x in b))


@st.composite
def vocabularies(draw: st.DrawFn) -> list[bytes | None]:
    """Random token tables: maybe every single byte, random merges (duplicates
    allowed), a few non-text ids, and EOS last."""
    table: list[bytes | None] = []
    if draw(st.booleans()):
        table += [bytes([b]) for b in ALPHABET]
    table += draw(st.lists(tokens, min_size=1, max_size=14))
    table += [None] * draw(st.integers(0, 2))
    draw(st.randoms(use_true_random=False)).shuffle(table)
    table.append(None)  # EOS
    return table


def spell(value: bytes, by_bytes: dict[bytes, list[int]]) -> list[int] | None:
    """Some token sequence spelling ``value`` exactly (dynamic programming), or None."""
    best: dict[int, list[int]] = {0: []}
    for end in range(1, len(value) + 1):
        for start in range(end):
            piece = value[start:end]
            if start in best and piece in by_bytes:
                best[end] = [*best[start], by_bytes[piece][0]]
                break
    return best.get(len(value))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    table=vocabularies(),
    values=st.lists(byte_strings, min_size=1, max_size=8),
    eos=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_vocabularies_and_sets(table: list[bytes | None], values: list[bytes], eos: bool, seed: int) -> None:
    eos_id = len(table) - 1
    vocab = Vocabulary(table, eos_token_ids=[eos_id], vocab_size=len(table) + 3)
    oracle = Oracle(table, values, [eos_id])
    spellings = {v: spell(v, oracle.by_bytes) for v in set(values)}
    try:
        automaton = Compiler(vocab).compile(values, eos=eos)
    except IncompatibleValueError as err:
        assert spellings[err.value] is None  # type: ignore[index]  # the error names a truly unspellable value
        return
    assert all(s is not None for s in spellings.values())  # no unspellable value slipped through

    states = check_against_oracle(automaton, table, values, [eos_id])
    completed = {automaton.value_of(s) for s in states if automaton.is_accepting(s)}
    assert completed == set(values)
    for state in states:  # never stuck: a state either allows a token or ends a value
        assert automaton.allowed_token_ids(state).size or automaton.is_accepting(state)
    end = [eos_id] if eos else []

    # every value through a tokenization of its own, and byte by byte when bytes are tokens
    for value, spelling in spellings.items():
        assert spelling is not None
        matcher = Matcher(automaton, max_rollback=64)
        assert matcher.accept_tokens([*spelling, *end]) == len(spelling) + len(end) and matcher.value == value
        byte_ids = [oracle.by_bytes.get(bytes([b]), [None])[0] for b in value]
        if None not in byte_ids:
            matcher.reset()
            assert matcher.accept_tokens([*byte_ids, *end]) == len(value) + len(end) and matcher.value == value

    # random walks over allowed tokens only ever complete to set members; the
    # matcher agrees with the automaton, rejected tokens included
    rng = random.Random(seed)
    for _ in range(5):
        matcher = Matcher(automaton, max_rollback=64)
        state = automaton.initial_state
        while automaton.allowed_token_ids(state).size and not (automaton.is_accepting(state) and rng.random() < 0.2):
            token = rng.randrange(len(table) + 3)
            if rng.random() < 0.7:
                token = rng.choice(automaton.allowed_token_ids(state).tolist())
            following = automaton.next_state(state, token)
            assert matcher.accept_token(token) == (following != DEAD)
            if following != DEAD:
                clone = matcher.copy()
                matcher.rollback(1)
                assert matcher.state == state
                matcher = clone
                state = following
            assert matcher.state == state
        assert automaton.value_of(state) in set(values)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    values=st.lists(st.text(alphabet=st.sampled_from("ab_.:-0123 éλ🦙<|>"), max_size=10), min_size=1, max_size=12),
    seed=st.integers(0, 2**16),
)
def test_random_sets_on_the_qwen_vocabulary(values: list[str], seed: int) -> None:
    real = real_vocabulary("qwen2")
    automaton = real_compiler("qwen2").compile(values)
    encoded = [v.encode() for v in values]
    check_against_oracle(automaton, real.table, encoded, real.vocab.eos_token_ids, real_tokens_by_bytes("qwen2"))
    rng = np.random.default_rng(seed)
    for _ in range(10):
        state = automaton.initial_state
        while not automaton.is_final(state):
            state = automaton.next_state(state, int(rng.choice(automaton.allowed_token_ids(state))))
        assert automaton.value_of(state) in set(values)


@pytest.mark.parametrize("layout", ["trie", "lazy"])
@pytest.mark.parametrize("native", [True, False])
def test_large_random_set_matches_the_oracle_on_sampled_states(
    native: bool, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large set (20,000 values, wide nodes stored as whole rows, long shared prefixes)
    against the first-principles oracle at 400 states reached by random walks: allowed
    tokens, one-row fills and one batch fill of all of them, with the C kernel and without,
    in the eager layout and in the lazy one (with a cache small enough to evict)."""
    from triemask.base import kernels as _kernels

    if not native:
        monkeypatch.setattr(_kernels, "KERNELS", None)
    rng = random.Random(3)
    letters = b"abcdefgh"
    merges = sorted({bytes(rng.choice(letters) for _ in range(rng.randint(2, 4))) for _ in range(300)})
    table: list[bytes | None] = [bytes([b]) for b in range(256)] + list(merges) + ["é".encode()] + [None]
    vocab = Vocabulary(table, eos_token_ids=[len(table) - 1])
    stems = [bytes(rng.choice(letters) for _ in range(rng.randint(0, 12))) for _ in range(400)]
    values = sorted(
        {rng.choice(stems) + bytes(rng.choice(letters) for _ in range(rng.randint(0, 6))) for _ in range(20_000)}
        | {"é".encode() * 3, b"a" * 40}
    )
    if layout == "lazy":
        automaton = Compiler(vocab).compile(values, layout="lazy", cache_bytes=50_000)
    else:
        automaton = Compiler(vocab).compile(values)
        assert automaton.stats()["rows_stored_whole"] > 0  # the wide nodes' rows are exercised
    oracle = Oracle(table, values, [len(table) - 1])
    states, prefixes = [], []
    for _ in range(400):
        state, prefix = automaton.initial_state, b""
        for _ in range(rng.randint(0, 8)):
            allowed = [t for t in automaton.allowed_token_ids(state).tolist() if t != len(table) - 1]
            if not allowed:
                break
            token = rng.choice(allowed)
            state, prefix = automaton.next_state(state, token), prefix + (table[token] or b"")
        states.append(state)
        prefixes.append(prefix)
    batch = np.zeros((len(states), (automaton.vocab_size + 31) // 32), dtype=np.int32)
    automaton.fill_bitmask(batch, states)
    row = np.zeros((1, batch.shape[1]), dtype=np.int32)
    for i, (state, prefix) in enumerate(zip(states, prefixes, strict=True)):
        expected = oracle.allowed(prefix)
        assert set(automaton.allowed_token_ids(state).tolist()) == expected, prefix
        automaton.fill_bitmask(row, [state])
        got = set(np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")).tolist())
        assert got == expected and np.array_equal(batch[i], row[0]), prefix
    if layout == "lazy":
        assert automaton.cache_info()["evictions"] > 0  # type: ignore[attr-defined]
