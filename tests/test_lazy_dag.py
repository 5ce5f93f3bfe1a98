"""The lazy layout of patterns (LazyDagAutomaton) against the eager DagAutomaton: the same
states, rows, steps, spelled text, strings and forced continuations on random patterns and
vocabularies (some lacking single-byte tokens), with the C kernel and with the NumPy
reference; what it refuses; and the kernel's checks of a DAG's slots."""

from __future__ import annotations

import pickle
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import byte_vocabulary, real_vocabulary
from test_native_patterns import REAL_PATTERNS
from test_regex import patterns, vocabularies
from triemask import (
    FORMATS,
    ArgumentTypeError,
    Compiler,
    DagAutomaton,
    IncompatibleValueError,
    LazyDagAutomaton,
    Matcher,
    MemoryLimitError,
    ValueSetError,
    Vocabulary,
)
from triemask.base import kernels as _kernels
from triemask.sets.lazy import lazy_dag_arrays
from triemask.sets.regex import dag_of_pattern


def same_automaton(lazy: LazyDagAutomaton, eager: DagAutomaton, seed: int) -> None:
    """Every node's edges, the steps along random walks and the text they spell, equal."""
    assert isinstance(lazy, LazyDagAutomaton) and isinstance(eager, DagAutomaton)
    assert (lazy.num_states, lazy.num_nodes, lazy.initial_state) == (eager.num_states, eager.num_nodes, 0)
    for node in range(eager.num_nodes):
        for mine, theirs in zip(lazy.edges(node), eager.edges(node), strict=True):
            assert mine.tolist() == theirs.tolist(), node
        assert lazy.forced_bytes(node) == eager.forced_bytes(node)
        assert lazy.is_accepting(node) == eager.is_accepting(node)
    width = (eager.vocab_size + 31) // 32
    states = np.arange(-1, eager.num_states, dtype=np.int64)
    mine_rows, their_rows = (np.zeros((len(states), width), dtype=np.int32) for _ in range(2))
    lazy.fill_bitmask(mine_rows, states)
    eager.fill_bitmask(their_rows, states)
    assert np.array_equal(mine_rows, their_rows)
    rng = random.Random(seed)
    for _ in range(6):
        ours, theirs = Matcher(lazy), Matcher(eager)
        while not theirs.is_terminated():
            allowed = theirs.allowed_token_ids()
            if len(allowed) == 0:
                break
            token = int(rng.choice(allowed.tolist()))
            assert ours.accept_token(token) and theirs.accept_token(token)
            assert (ours.state, ours.value) == (theirs.state, theirs.value)
    assert lazy.num_values == eager.num_values and lazy.set_fingerprint == eager.set_fingerprint
    if eager.num_values <= 50:
        assert lazy.values() == eager.values()


@pytest.fixture(params=["c", "reference"])
def layer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The C kernel, or the NumPy reference (the extension hidden)."""
    if request.param == "reference":
        monkeypatch.setattr(_kernels, "KERNELS", None)
    elif _kernels.KERNELS is None:
        pytest.skip("the C extension is not built")
    return str(request.param)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pattern=patterns(), table=vocabularies(), eos=st.booleans(), seed=st.integers(0, 99))
def test_random_patterns_lazy_equal_eager(
    pattern: tuple[str, int], table: list[bytes | None], eos: bool, seed: int, layer: str
) -> None:
    text, _ = pattern
    vocab = Vocabulary(table, eos_token_ids=[len(table) - 1], vocab_size=len(table) + 2)
    compiler = Compiler(vocab, disk_cache=False)
    try:
        eager = compiler.compile_regex(text, eos=eos)
    except IncompatibleValueError:
        with pytest.raises(IncompatibleValueError):
            compiler.compile_regex(text, eos=eos, layout="lazy")
        return
    lazy = compiler.compile_regex(text, eos=eos, layout="lazy")
    assert isinstance(eager, DagAutomaton) and isinstance(lazy, LazyDagAutomaton)
    same_automaton(lazy, eager, seed)


WIDE_CLASSES = ["A-Za-z_", "A-Za-z0-9_", "a-z0-9", "a-zA-Z.", "0-9a-f", "a-z", "^x-z", "a-z_-"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    first=st.sampled_from(WIDE_CLASSES),
    rest=st.sampled_from(WIDE_CLASSES),
    length=st.integers(0, 9),
    tail=st.sampled_from(["", "(\\.[a-z]{1,3})?", "-?[0-9]"]),
    merges=st.lists(st.text(alphabet="abcxyzAB09_.- ", min_size=2, max_size=7), max_size=40),
    seed=st.integers(0, 99),
)
def test_wide_runs_lazy_equal_eager(
    first: str, rest: str, length: int, tail: str, merges: list[str], seed: int, layer: str
) -> None:
    """Identifier-like patterns (wide classes, long runs) over vocabularies of letters, digits
    and punctuation: the subtrees matched whole, or scanned along a closed run, give every
    node the eager automaton's edges."""
    vocab = byte_vocabulary([m.encode() for m in merges])
    compiler = Compiler(vocab, disk_cache=False)
    pattern = f"[{first}][{rest}]{{0,{length}}}{tail}"
    same_automaton(compiler.compile_regex(pattern, layout="lazy"), compiler.compile_regex(pattern), seed)


@pytest.mark.parametrize("name", ["qwen2", "mistral-spm-32k"])
def test_real_patterns_lazy_equal_eager(name: str) -> None:
    compiler = Compiler(real_vocabulary(name).vocab)
    for i, pattern in enumerate(REAL_PATTERNS):
        eager = compiler.compile_regex(pattern)
        lazy = compiler.compile_regex(pattern, layout="lazy")
        assert isinstance(eager, DagAutomaton) and isinstance(lazy, LazyDagAutomaton)
        same_automaton(lazy, eager, seed=i)
    for format_name in FORMATS:
        lazy = compiler.compile_format(format_name, layout="lazy")
        assert isinstance(lazy, LazyDagAutomaton) and lazy.pattern == FORMATS[format_name]


@pytest.mark.skipif(_kernels.KERNELS is None, reason="the C extension is not built")
def test_wide_rows_of_a_lazy_pattern_are_kept_as_rows_alone() -> None:
    """A DAG's node allowing half the vocabulary or more keeps its row alone (no tokens and
    dests listed); a step reads the token's bytes down the DAG: the same destination for
    every token of the vocabulary as the eager automaton's, EOS included, and the same edges."""
    vocab = real_vocabulary("qwen2").vocab
    compiler = Compiler(vocab)
    pattern = "[A-Za-z_][A-Za-z0-9_]{0,5}"
    eager = compiler.compile_regex(pattern)
    lazy = compiler.compile_regex(pattern, layout="lazy")
    assert isinstance(lazy, LazyDagAutomaton)
    bitmask = np.zeros((1, (vocab.vocab_size + 31) // 32), dtype=np.int32)
    lazy.fill_bitmask(bitmask, (lazy.initial_state,))
    wide = len(eager.allowed_token_ids(eager.initial_state))
    assert wide * 32 >= vocab.vocab_size * 4  # wide enough to be kept whole
    assert lazy.cache_info()["bytes"] < 2 * bitmask.nbytes + 4096 < 8 * wide  # the row, not its edges
    assert lazy.stats()["child_lookup"] == "table and runs"
    for state in (lazy.initial_state, lazy.next_state(lazy.initial_state, int(eager.allowed_token_ids(0)[0]))):
        tokens = np.arange(vocab.vocab_size)
        assert [lazy.next_state(state, int(t)) for t in tokens] == [eager.next_state(state, int(t)) for t in tokens]
        for mine, theirs in zip(lazy.edges(state), eager.edges(state), strict=True):
            assert np.array_equal(mine, theirs)
    states = np.asarray([0, 1, 0], dtype=np.int64)
    for mine, theirs in zip(lazy.allowed_token_pairs(states), eager.allowed_token_pairs(states), strict=True):
        assert np.array_equal(mine, theirs)
    final = eager.next_state(1, vocab.eos_token_ids[0])
    assert final >= eager.num_nodes and lazy.next_state(1, vocab.eos_token_ids[0]) == final


def test_a_lazy_pattern_spells_its_text_and_reports_itself(layer: str) -> None:
    compiler = Compiler(byte_vocabulary([b"20", b"-0", b"12"]), disk_cache=False)
    lazy = compiler.compile_format("date", layout="lazy")
    matcher = Matcher(lazy)
    tokens = [*b"2024", 257, *b"1-"]  # (byte tokens are their bytes; "-0" is 257, "12" 258)
    assert matcher.accept_tokens(tokens) == len(tokens)
    assert matcher.value is None and matcher.find_jump_forward_string() == ""
    assert matcher.accept_token(258) and matcher.value == "2024-01-12" == lazy.spell([*tokens, 258])
    stats = lazy.stats()
    assert stats["layout"] == "lazy" and stats["pattern"] == FORMATS["date"] and stats["dag_nodes"] == lazy.num_nodes
    assert stats["cache"]["entries"] >= 1 and "trie_nodes" not in stats
    assert "LazyDagAutomaton(pattern=" in repr(lazy)
    assert lazy.value(0) == "0000-01-01" and lazy.value_index(lazy.initial_state) is None


def test_what_a_lazy_pattern_refuses() -> None:
    compiler = Compiler(byte_vocabulary(), disk_cache=False)
    lazy = compiler.compile_regex("[ab]{2}", layout="lazy")
    with pytest.raises(ArgumentTypeError, match="not saved"):
        lazy.save("/nonexistent/never-written.tm")
    with pytest.raises(ArgumentTypeError, match="not saved"):
        pickle.dumps(lazy)
    with pytest.raises(ArgumentTypeError, match="no edge arrays"):
        lazy.edge_arrays()
    with pytest.raises(ArgumentTypeError, match="sets of values"):
        lazy.with_values(added=["cc"])
    for bad in ("trie", "Lazy", None, 3):
        with pytest.raises(ValueSetError, match="layout"):
            compiler.compile_regex("[ab]{2}", layout=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueSetError, match="layout"):
            compiler.compile_format("date", layout=bad)  # type: ignore[arg-type]
    with pytest.raises(MemoryLimitError):
        compiler.compile_regex("[ab]{2}", layout="lazy", max_bytes=1_000)
    for bad_cache in (-1, "8", 1.5):
        with pytest.raises(ValueSetError, match="cache_bytes"):
            compiler.compile_regex("[ab]{2}", layout="lazy", cache_bytes=bad_cache)  # type: ignore[arg-type]
    with pytest.raises(ValueSetError, match="layout='lazy' only"):
        compiler.compile_format("date", cache_bytes=1 << 20)


def test_a_lazy_pattern_without_a_cache_gives_the_same_masks(layer: str) -> None:
    compiler = Compiler(byte_vocabulary([b"1.", b"25", b"0."]), disk_cache=False)
    eager = compiler.compile_format("ipv4")
    uncached = compiler.compile_format("ipv4", layout="lazy", cache_bytes=0)
    assert isinstance(eager, DagAutomaton) and isinstance(uncached, LazyDagAutomaton)
    assert uncached.cache_info()["limit"] == 0
    same_automaton(uncached, eager, seed=3)
    assert uncached.cache_info()["entries"] == 0


def test_a_dag_automaton_keeps_its_slots() -> None:
    """The language methods moved to a mixin: both layouts' instances stay without a __dict__."""
    compiler = Compiler(byte_vocabulary(), disk_cache=False)
    for layout in ("dag", "lazy"):
        automaton = compiler.compile_regex("a[bc]?", layout=layout)
        assert not hasattr(automaton, "__dict__")


@pytest.mark.skipif(_kernels.KERNELS is None, reason="the C extension is not built")
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pattern=patterns(), dead=st.lists(st.booleans(), min_size=1, max_size=40))
def test_the_c_layout_of_a_dag_is_the_references(
    pattern: tuple[str, int], dead: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """lazy_dag_layout's arrays equal sets.lazy's NumPy ones, nodes marked dead included."""
    dag = dag_of_pattern(pattern[0])
    live = np.resize(~np.asarray(dead), dag.num_nodes)
    for marks in (None, live):
        mine = lazy_dag_arrays(dag, marks)
        with monkeypatch.context() as patch:
            patch.setattr(_kernels, "KERNELS", None)
            theirs = lazy_dag_arrays(dag, marks)
        assert mine.keys() == theirs.keys()
        for name, array in mine.items():
            assert array.dtype == theirs[name].dtype and np.array_equal(array, theirs[name]), name


@pytest.mark.skipif(_kernels.KERNELS is None, reason="the C extension is not built")
def test_the_c_layout_refuses_inconsistent_dags() -> None:
    native = _kernels.KERNELS
    assert native is not None
    dag = dag_of_pattern("(a|b[ab]){1,3}c?")
    arrays = [dag.source, dag.byte, dag.dest, dag.accepting]
    n = dag.num_nodes
    for victim, value in [(0, n), (0, -1), (2, n), (3, n), (3, -5)]:
        bad = [array.copy() for array in arrays]
        bad[victim][0] = value
        with pytest.raises(ValueError, match="out of range"):
            native.lazy_dag_layout(*bad, n)
    with pytest.raises(ValueError, match="out of range"):
        native.lazy_dag_layout(arrays[0], arrays[1][:-1], *arrays[2:], n)
    with pytest.raises(ValueError, match="out of range"):
        native.lazy_dag_layout(*arrays, 0)
    fan = np.zeros(257, np.int32)  # 257 edges out of one node
    with pytest.raises(ValueError, match="more than 256"):
        native.lazy_dag_layout(fan, np.zeros(257, np.uint8), np.ones(257, np.int32), np.ones(1, np.int32), 2)


@pytest.mark.skipif(_kernels.KERNELS is None, reason="the C extension is not built")
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_lazy_kernel_checks_a_dags_slots(data: st.DataObject) -> None:
    """A DAG's arrays, perturbed: a kernel whose every call stays in bounds, or ValueError."""
    native = _kernels.KERNELS
    assert native is not None
    vocab = byte_vocabulary([b"ab", b"ba"])
    base = Compiler(vocab, disk_cache=False).compile_regex("(a|b[ab]){1,3}c?", layout="lazy")
    assert isinstance(base, LazyDagAutomaton)
    arrays: list[Any] = [
        base._node_byte,
        base._node_word,
        base._child_blocks,
        base._terminal_blocks,
        base._terminal_values,
        base._slot_dest,
    ]
    victim = data.draw(st.integers(0, len(arrays) - 1))
    array = arrays[victim].copy()
    if len(array) and data.draw(st.booleans()):
        value = np.asarray(data.draw(st.integers(-2, 600))).astype(array.dtype)
        array[data.draw(st.integers(0, len(array) - 1))] = value
    else:
        array = np.resize(array, data.draw(st.integers(0, len(array) + 2)))
    arrays[victim] = array
    width = (vocab.vocab_size + 31) // 32
    tables = base._token_trie.native_tables(width)
    eos = np.asarray(vocab.eos_token_ids, dtype=np.int32)
    try:
        kernel = native.lazy_kernel(
            *arrays[:5], tables, eos, base.num_nodes, base.num_states, width, 1, 10_000, arrays[5]
        )
    except ValueError:
        return
    bitmask = np.zeros((2, width), dtype=np.int32)
    for state in range(-1, base.num_states + 1):
        following = kernel.next(state, data.draw(st.integers(-1, 300)))
        assert following is None or -1 <= following < base.num_states
        kernel.fill(bitmask, 0, state)
        if 0 <= state < base.num_nodes:
            tokens, dests = (np.frombuffer(b, dtype=np.int32) for b in kernel.edges(state))
            assert ((tokens >= 0) & (tokens < 32 * width)).all() and ((dests >= 0) & (dests < base.num_states)).all()
            assert kernel.spell(state) is None  # (a DAG's node does not determine its text)
    kernel.pairs(list(range(base.num_states)))


@pytest.mark.skipif(_kernels.KERNELS is None, reason="the C extension is not built")
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_wide_dag_over_perturbed_token_tries(data: st.DataObject) -> None:
    """A DAG whose rows are wide (kept as rows alone, steps reading tokens' bytes up the token
    trie) and whose runs match subtrees whole, over token-trie arrays perturbed: either refused
    with ValueError when the tables are made, or every call stays in bounds and in range
    (make test-asan runs this under AddressSanitizer)."""
    native = _kernels.KERNELS
    assert native is not None
    vocab = byte_vocabulary([b"ab", b"abc", b"ba", b"xyz", b"a\xc3\xa9"])
    base = Compiler(vocab, disk_cache=False).compile_regex("[^x]{0,3}x?", layout="lazy")
    assert isinstance(base, LazyDagAutomaton)
    trie = base._token_trie
    arrays: list[Any] = [trie.children, trie.node_byte, trie.token_offsets, trie.token_ids]
    victim = data.draw(st.integers(0, len(arrays) - 1))
    array = arrays[victim].copy()
    if len(array) and data.draw(st.booleans()):
        value = np.asarray(data.draw(st.integers(-2, 600))).astype(array.dtype)
        array[data.draw(st.integers(0, len(array) - 1))] = value
    elif data.draw(st.booleans()):
        array = np.resize(array, data.draw(st.integers(0, len(array) + 2)))
    arrays[victim] = array
    width = (vocab.vocab_size + 31) // 32
    try:
        tables = native.TokenTrieTables(*arrays, width)
    except ValueError:
        return
    kernel = native.lazy_kernel(
        base._node_byte,
        base._node_word,
        base._child_blocks,
        base._terminal_blocks,
        base._terminal_values,
        tables,
        np.asarray(vocab.eos_token_ids, dtype=np.int32),
        base.num_nodes,
        base.num_states,
        width,
        1,
        data.draw(st.sampled_from([0, 100, 1 << 20])),
        base._slot_dest,
    )
    bitmask = np.zeros((2, width), dtype=np.int32)
    for state in range(-1, base.num_states + 1):
        kernel.fill(bitmask, 0, state)
        for token in (data.draw(st.integers(-1, 32 * width)), 0, ord("a"), 32 * width - 1):
            following = kernel.next(state, token)
            assert following is None or -1 <= following < base.num_states
        if 0 <= state < base.num_nodes:
            tokens, dests = (np.frombuffer(b, dtype=np.int32) for b in kernel.edges(state))
            assert ((tokens >= 0) & (tokens < 32 * width)).all() and ((dests >= -1) & (dests < base.num_states)).all()
    kernel.pairs(list(range(base.num_states)))


@pytest.mark.skipif(_kernels.KERNELS is None, reason="the C extension is not built")
def test_lazy_kernel_takes_only_a_checked_token_trie() -> None:
    native = _kernels.KERNELS
    assert native is not None
    vocab = byte_vocabulary()
    base = Compiler(vocab, disk_cache=False).compile_regex("[ab]c", layout="lazy")
    assert isinstance(base, LazyDagAutomaton)
    width = (vocab.vocab_size + 31) // 32
    arrays = [base._node_byte, base._node_word, base._child_blocks, base._terminal_blocks, base._terminal_values]
    eos = np.asarray(vocab.eos_token_ids, dtype=np.int32)
    unchecked = native.TokenTrieTables.__new__(native.TokenTrieTables)
    other_width = base._token_trie.native_tables(width + 1)
    for tables in (unchecked, other_width):
        with pytest.raises(ValueError, match="token trie"):
            native.lazy_kernel(*arrays, tables, eos, base.num_nodes, base.num_states, width, 1, 0, base._slot_dest)
    with pytest.raises(ValueError, match="token trie arrays"):
        empty = (np.zeros(1, np.int32), np.zeros(0, np.uint8), np.zeros(1, np.int32), np.zeros(0, np.int32))
        native.TokenTrieTables(*empty, width)


@pytest.mark.parametrize("pattern", [".{0,3}", "[\\x00-\\x7f]{1,2}x", "[^a]é?", "\\s\\S{2}"])
def test_wide_classes_with_every_byte_a_token(pattern: str, layer: str) -> None:
    """Nodes with up to 256 out-edges (every byte of a class a token, merges across them)."""
    merges = [b"ab", b"\xc3\xa9", b"\x00\xff", b"\n\r", b" x", b"xx"]
    compiler = Compiler(byte_vocabulary(merges), disk_cache=False)
    eager = compiler.compile_regex(pattern)
    lazy = compiler.compile_regex(pattern, layout="lazy")
    assert isinstance(eager, DagAutomaton) and isinstance(lazy, LazyDagAutomaton)
    same_automaton(lazy, eager, seed=len(pattern))
