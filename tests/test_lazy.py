"""The lazy layout (``compile(values, layout="lazy")``): the same states and masks as the
eager layout, found on first use and kept in a byte-bounded cache."""

from __future__ import annotations

import pickle
import random
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import byte_vocabulary, real_compiler
from oracle import explore
from test_properties import byte_strings, vocabularies
from triemask import (
    DEAD,
    DEFAULT_CACHE_BYTES,
    Compiler,
    IncompatibleValueError,
    LazyTrieAutomaton,
    Matcher,
    MemoryLimitError,
    TrieAutomaton,
    ValueSetError,
    Vocabulary,
)
from triemask.datasets import synthetic_tools


@pytest.fixture(params=[True, False], ids=["native", "numpy"])
def native(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Run with the C extension's cache, and with the NumPy reference and its Python LRU."""
    from triemask.base import kernels as _kernels

    if not request.param:
        monkeypatch.setattr(_kernels, "KERNELS", None)
    elif _kernels.KERNELS is None:
        pytest.skip("the C extension is not built")
    return bool(request.param)


def assert_same_automaton(
    eager: TrieAutomaton, lazy: TrieAutomaton, table: list[bytes | None], rng: random.Random
) -> None:
    """Equal at every reachable state: allowed tokens, transitions (allowed and random tokens),
    acceptance, values, and bitmask rows (one by one and in one batch)."""
    assert (lazy.num_nodes, lazy.num_states, lazy.num_values) == (eager.num_nodes, eager.num_states, eager.num_values)
    table_size = len(table)
    states = sorted(explore(eager, table))
    for state in states:
        allowed = eager.allowed_token_ids(state)
        assert np.array_equal(lazy.allowed_token_ids(state), allowed), state
        for token in [*allowed.tolist(), rng.randrange(table_size), rng.randrange(table_size)]:
            assert lazy.next_state(state, token) == eager.next_state(state, token)
        assert lazy.is_accepting(state) == eager.is_accepting(state)
        assert lazy.is_final(state) == eager.is_final(state)
        assert lazy.value_of(state) == eager.value_of(state)
    width = (eager.vocab_size + 31) // 32
    expected, got = np.zeros((len(states), width), np.int32), np.full((len(states), width), -1, np.int32)
    eager.fill_bitmask(expected, states)
    lazy.fill_bitmask(got, states)
    assert np.array_equal(got, expected)
    row = np.full((1, width), -1, dtype=np.int32)
    for i, state in enumerate(states):
        lazy.fill_bitmask(row, [state])
        assert np.array_equal(row[0], expected[i])
    tokens = [rng.choice(eager.allowed_token_ids(s).tolist() or [0]) for s in states]
    assert np.array_equal(lazy.next_states(states, tokens), eager.next_states(states, tokens))
    for rows, ids in zip(lazy.allowed_token_pairs(states), eager.allowed_token_pairs(states), strict=True):
        assert np.array_equal(rows, ids)
    assert lazy.values() == eager.values()
    assert [lazy.value(i) for i in range(lazy.num_values)] == eager.values()
    assert np.array_equal(lazy.accepting_nodes, eager.accepting_nodes)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    table=vocabularies(),
    values=st.lists(byte_strings, min_size=1, max_size=10),
    eos=st.booleans(),
    cache_bytes=st.sampled_from([0, 200, 2_000, DEFAULT_CACHE_BYTES]),
    native=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_lazy_equals_eager_on_random_vocabularies(
    table: list[bytes | None], values: list[bytes], eos: bool, cache_bytes: int, native: bool, seed: int
) -> None:
    """Hypothesis: random byte vocabularies (some lacking single-byte tokens, with duplicate
    tokens, non-text ids) x random sets x cache bounds, with and without the C extension:
    the two layouts agree everywhere, incompatible values included."""
    from triemask.base import kernels as _kernels

    saved = _kernels.KERNELS
    if not native:
        _kernels.KERNELS = None
    try:
        vocab = Vocabulary(table, eos_token_ids=[len(table) - 1], vocab_size=len(table) + 3)
        compiler = Compiler(vocab)
        try:
            eager = compiler.compile(values, eos=eos)
        except IncompatibleValueError as error:
            with pytest.raises(IncompatibleValueError) as raised:
                compiler.compile(values, eos=eos, layout="lazy", cache_bytes=cache_bytes)
            assert str(raised.value) == str(error)
            return
        lazy = compiler.compile(values, eos=eos, layout="lazy", cache_bytes=cache_bytes)
        assert isinstance(lazy, LazyTrieAutomaton) and lazy.cache_bytes == cache_bytes
        assert_same_automaton(eager, lazy, [*table, None, None, None], random.Random(seed))
        info = lazy.cache_info()
        assert info["bytes"] <= max(cache_bytes, 0) or info["entries"] == 0
    finally:
        _kernels.KERNELS = saved


def _large_set(rng: random.Random) -> tuple[Vocabulary, list[bytes]]:
    letters = b"abcdefgh"
    merges = sorted({bytes(rng.choice(letters) for _ in range(rng.randint(2, 4))) for _ in range(300)})
    table: list[bytes | None] = [bytes([b]) for b in range(256)] + list(merges) + [None]
    vocab = Vocabulary(table, eos_token_ids=[len(table) - 1])
    stems = [bytes(rng.choice(letters) for _ in range(rng.randint(0, 12))) for _ in range(400)]
    values = sorted(
        {rng.choice(stems) + bytes(rng.choice(letters) for _ in range(rng.randint(0, 6))) for _ in range(20_000)}
    )
    return vocab, values


@pytest.mark.parametrize("cache_bytes", [0, 10_000, DEFAULT_CACHE_BYTES])
def test_large_set_equals_eager_on_sampled_states(native: bool, cache_bytes: int) -> None:
    """20,000 values, 400 states from random walks: rows (wide ones kept whole by the C cache),
    transitions and a batch fill equal the eager layout's, with the cache evicting (10 KB),
    keeping nothing (0) or everything; the cache never exceeds its bound."""
    rng = random.Random(5)
    vocab, values = _large_set(rng)
    compiler = Compiler(vocab)
    eager = compiler.compile(values)
    lazy = compiler.compile(values, layout="lazy", cache_bytes=cache_bytes)
    states = []
    for _ in range(400):
        state = eager.initial_state
        for _ in range(rng.randint(0, 8)):
            allowed = eager.allowed_token_ids(state).tolist()
            if not allowed:
                break
            state = eager.next_state(state, rng.choice(allowed))
        states.append(state)
    expected = np.zeros((len(states), (eager.vocab_size + 31) // 32), dtype=np.int32)
    got = np.full_like(expected, -1)
    eager.fill_bitmask(expected, states)
    lazy.fill_bitmask(got, states)
    assert np.array_equal(got, expected)
    for state in states:
        allowed = eager.allowed_token_ids(state)
        assert np.array_equal(lazy.allowed_token_ids(state), allowed)
        probe = [*allowed[:20].tolist(), rng.randrange(vocab.vocab_size)]
        assert lazy.next_states([state] * len(probe), probe).tolist() == [eager.next_state(state, t) for t in probe]
    info = lazy.cache_info()
    assert info["bytes"] <= cache_bytes or info["entries"] == 0
    assert info["misses"] > 0
    if cache_bytes == 10_000:
        assert info["evictions"] > 0 and info["entries"] > 0
    if cache_bytes == 0:
        assert info["entries"] == 0 and info["hits"] == 0
    if cache_bytes == DEFAULT_CACHE_BYTES:
        assert info["evictions"] == 0 and info["hits"] > 0


def test_qwen_tools_equal_eager_and_smaller() -> None:
    """A real byte-level BPE vocabulary (Qwen2, 151K tokens) on 3,000 tool names: equal at the
    states of 200 decoded values, several times smaller, values spelled back from the trie."""
    compiler = real_compiler("qwen2")
    values = synthetic_tools(3_000)
    eager = compiler.compile(values)
    lazy = compiler.compile(values, layout="lazy")
    assert lazy.memory_bytes * 4 < eager.memory_bytes
    rng = random.Random(0)
    for value in rng.sample(values, 200):
        state, text = 0, value.encode()
        while text:
            allowed = eager.allowed_token_ids(state)
            assert np.array_equal(lazy.allowed_token_ids(state), allowed)
            token = max(
                (t for t in allowed.tolist() if text.startswith(compiler.vocab.token_bytes(t) or b"\xff\xff")),
                key=lambda t: len(compiler.vocab.token_bytes(t) or b""),
            )
            text = text[len(compiler.vocab.token_bytes(token) or b"") :]
            state = lazy.next_state(state, token)
            assert state != DEAD
        assert lazy.value_of(state) == value
        final = lazy.next_state(state, compiler.vocab.eos_token_ids[0])
        assert lazy.is_final(final) and lazy.value_of(final) == value
    stats = lazy.stats()
    assert stats["layout"] == "lazy" and stats["cache"]["entries"] > 0 and stats["token_trie_bytes"] > 0


def test_matcher_pickle_and_cache_controls(native: bool) -> None:
    vocab = byte_vocabulary([b"ab", b"abc", b"ca"])
    values = ["abc", "abd", "ca", "cab", "c"]
    compiler = Compiler(vocab)
    eager = compiler.compile(values)
    lazy = compiler.compile(values, layout="lazy", cache_bytes=10_000)
    matcher = Matcher(lazy)
    assert matcher.accept_tokens(list(b"ca")) == 2 and matcher.accept_token(vocab.eos_token_ids[0])
    assert matcher.is_terminated() and matcher.value == "ca"
    copy = pickle.loads(pickle.dumps(lazy))
    assert isinstance(copy, LazyTrieAutomaton) and copy.cache_bytes == 10_000
    assert copy.cache_info()["entries"] == 0  # the cache is not pickled
    for state in range(lazy.num_states):
        assert np.array_equal(copy.allowed_token_ids(state), eager.allowed_token_ids(state))
    assert lazy.cache_info()["entries"] > 0
    lazy.cache_clear()
    info = lazy.cache_info()
    assert info["entries"] == 0 and info["misses"] > 0
    assert "LazyTrieAutomaton(values=5" in repr(lazy)


def test_threads_share_one_small_cache(native: bool) -> None:
    """Eight threads decode through one automaton whose cache holds a few nodes: every mask
    stays exact while the cache evicts under them."""
    rng = random.Random(1)
    vocab, values = _large_set(rng)
    compiler = Compiler(vocab)
    eager = compiler.compile(values[:3000])
    lazy = compiler.compile(values[:3000], layout="lazy", cache_bytes=5_000)
    failures: list[str] = []

    def work(seed: int) -> None:
        local = random.Random(seed)
        for _ in range(40):
            state = eager.initial_state
            while eager.allowed_token_ids(state).size:
                allowed = eager.allowed_token_ids(state)
                if not np.array_equal(lazy.allowed_token_ids(state), allowed):
                    failures.append(f"state {state}")
                token = local.choice(allowed.tolist())
                if lazy.next_state(state, token) != eager.next_state(state, token):
                    failures.append(f"state {state} token {token}")
                state = eager.next_state(state, token)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert lazy.cache_info()["evictions"] > 0 and lazy.cache_info()["bytes"] <= 5_000


def test_lazy_arguments_are_checked() -> None:
    compiler = Compiler(byte_vocabulary())
    with pytest.raises(ValueSetError, match="cache_bytes applies to layout='lazy' only"):
        compiler.compile(["a"], cache_bytes=100)
    with pytest.raises(ValueSetError, match="cache_bytes must be a non-negative integer, got -1"):
        compiler.compile(["a"], layout="lazy", cache_bytes=-1)
    with pytest.raises(ValueSetError, match="cache_bytes"):
        compiler.compile(["a"], layout="lazy", cache_bytes=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueSetError, match="layout must be 'trie', 'dag' or 'lazy', got 'eager'"):
        compiler.compile(["a"], layout="eager")
    with pytest.raises(MemoryLimitError) as raised:
        compiler.compile(["abc", "abd"], layout="lazy", max_bytes=1_000)  # the default 8 MiB bound alone exceeds it
    assert raised.value.limit == 1_000 and raised.value.needed > DEFAULT_CACHE_BYTES
    small = compiler.compile(["abc", "abd"], layout="lazy", max_bytes=10_000, cache_bytes=2_000)
    assert small.memory_bytes <= 10_000
    with pytest.raises(ValueSetError, match="empty"):
        compiler.compile([], layout="lazy")


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_lazy_kernel_rejects_inconsistent_arrays(data: st.DataObject) -> None:
    """A fuzz of the lazy kernel's inputs: arbitrary small arrays (some taken from a real
    lazy automaton, then perturbed) either build a kernel whose every call stays in bounds
    and in range, or are refused with ValueError; never a crash (make test-asan runs this
    under AddressSanitizer)."""
    from triemask.base import kernels as _kernels

    native = _kernels.KERNELS
    if native is None:
        pytest.skip("the C extension is not built")
    vocab = byte_vocabulary([b"ab", b"ba"])
    base = Compiler(vocab).compile(["ab", "abc", "b", "ca"], layout="lazy")
    trie = base._token_trie  # the arrays under test
    arrays = [
        base._node_byte,
        base._node_word,
        base._child_blocks,
        base._terminal_blocks,
        base._terminal_values,
        trie.children,
        trie.node_byte,
        trie.token_offsets,
        trie.token_ids,
        np.asarray(vocab.eos_token_ids, dtype=np.int32),
    ]
    victim = data.draw(st.integers(0, len(arrays) - 1))
    array = arrays[victim].copy()
    if len(array) and data.draw(st.booleans()):
        value = np.asarray(data.draw(st.integers(-2, 600))).astype(array.dtype)  # wraps for unsigned arrays
        array[data.draw(st.integers(0, len(array) - 1))] = value
    else:
        array = np.resize(array, data.draw(st.integers(0, len(array) + 2)))
    arrays[victim] = array
    num_nodes = base.num_nodes + data.draw(st.sampled_from([0, 0, 0, -1, 1]))
    num_states = base.num_states + data.draw(st.sampled_from([0, 0, 0, -1, 1]))
    width = (vocab.vocab_size + 31) // 32
    try:
        tables = native.TokenTrieTables(*arrays[5:9], width)
        kernel = native.lazy_kernel(
            *arrays[:5],
            tables,
            arrays[9],
            num_nodes,
            num_states,
            width,
            1,
            data.draw(st.sampled_from([0, 100, 10_000])),
            None,
        )
    except ValueError:
        return
    bitmask = np.zeros((2, width), dtype=np.int32)
    for state in range(-1, num_states + 1):
        following = kernel.next(state, data.draw(st.integers(-1, 300)))
        assert following is None or -1 <= following < num_states
        kernel.fill(bitmask, 0, state)
        if 0 <= state < num_nodes:
            tokens, dests = (np.frombuffer(b, dtype=np.int32) for b in kernel.edges(state))
            assert ((tokens >= 0) & (tokens < 32 * width)).all() and ((dests >= 0) & (dests < num_states)).all()
            spelled = kernel.spell(state)
            assert spelled is not None and len(spelled) <= num_nodes
    kernel.fill_batch(bitmask, [0, num_nodes - 1], None)
    kernel.pairs(list(range(num_states)))


def test_long_values_are_spelled_back(native: bool) -> None:
    values = ["x" * 700, "x" * 300 + "y", "z"]
    lazy = Compiler(byte_vocabulary()).compile(values, layout="lazy")
    assert [lazy.value(i) for i in range(3)] == sorted(values) == lazy.values()
