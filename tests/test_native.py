"""The C kernel against the NumPy reference: the same answers and the same typed errors for
every call, on random vocabularies, sets and arguments; the fallbacks (TRIEMASK_NATIVE=0, no
extension) behave identically; the kernel never reads or writes out of bounds, whatever
arrays it is given."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import byte_vocabulary
from triemask import Compiler, Matcher, TriemaskError, Vocabulary, allocate_token_bitmask
from triemask.automata import checks
from triemask.automata import trie as _automaton
from triemask.base import kernels as _kernels
from triemask.vocab import TokenIndex

pytestmark = pytest.mark.skipif(not _kernels.NATIVE, reason="built without the C extension")

ALPHABET = b"abc\xc3"
words = st.binary(min_size=0, max_size=5).map(lambda b: bytes(ALPHABET[x % len(ALPHABET)] for x in b))


def twins(vocab: Vocabulary, values: list[bytes], monkeypatch: pytest.MonkeyPatch, **options: Any) -> tuple[Any, Any]:
    """The same set compiled with the kernel and without it (the reference)."""
    compiler = Compiler(vocab)
    native = compiler.compile(values, **options)
    with monkeypatch.context() as patch:
        patch.setattr(_kernels, "KERNELS", None)
        reference = compiler.compile(values, **options)
    assert _automaton.native_kernel(native) is not None and _automaton.native_kernel(reference) is None
    # the C compile loops lay out exactly the arrays the NumPy compiler does
    mine, theirs = native._stored_arrays(), reference._stored_arrays()
    for name, array in mine.items():
        if isinstance(array, np.ndarray):
            assert array.dtype == theirs[name].dtype and np.array_equal(array, theirs[name]), name
    return native, reference


def outcome(call: Any, *args: Any, **kwargs: Any) -> Any:
    """A call's result, or its error's type and message (the reference raises typed errors)."""
    try:
        result = call(*args, **kwargs)
    except TriemaskError as error:
        return type(error), str(error)
    if isinstance(result, tuple):  # allowed_token_pairs: two arrays, dtypes compared too
        return tuple((part.dtype.str, part.tolist()) for part in result)
    return result.tolist() if isinstance(result, np.ndarray) else result


ODD = [-2, -1, True, np.int64(1), np.uint64(3), 1.0, "1", None, 2**40, -(2**70)]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    merges=st.lists(st.binary(min_size=2, max_size=3).map(lambda b: bytes(ALPHABET[x % 4] for x in b)), max_size=6),
    values=st.lists(words, min_size=1, max_size=8),
    picks=st.lists(st.integers(0, 10_000), min_size=1, max_size=40),
    odd=st.sampled_from(ODD),
)
def test_kernel_equals_reference(
    merges: list[bytes], values: list[bytes], picks: list[int], odd: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    vocab = byte_vocabulary(merges)
    native, reference = twins(vocab, values, monkeypatch)
    states = list(range(-1, native.num_states + 1))
    tokens = list(range(vocab.vocab_size + 1))
    chosen = [states[p % len(states)] for p in picks]
    toks = [tokens[p % len(tokens)] for p in picks]
    for state, token in zip(chosen, toks, strict=True):
        assert outcome(native.next_state, state, token) == outcome(reference.next_state, state, token)
    for arguments in ((odd, 0), (0, odd)):
        assert outcome(native.next_state, *arguments) == outcome(reference.next_state, *arguments)
    for batch in (chosen, np.asarray(chosen, dtype=np.int32), [*chosen[:-1], odd]):
        same = (batch, toks if len(batch) == len(toks) else toks[: len(batch)])
        assert outcome(native.next_states, *same) == outcome(reference.next_states, *same)
    for batch in (chosen, np.asarray(chosen, dtype=np.int32), np.asarray(chosen), [*chosen[:-1], odd], []):
        assert outcome(native.allowed_token_pairs, batch) == outcome(reference.allowed_token_pairs, batch)
    width = allocate_token_bitmask(1, vocab.vocab_size).shape[1]
    for batch, rows in (
        (chosen[:1], None),
        (chosen, None),
        (chosen, list(range(len(chosen)))[::-1]),
        (chosen, [0] * len(chosen)),
        ([odd], None),
        (chosen[:2], [0, odd]),
    ):
        mine, theirs = (np.full((len(chosen) + 1, width), 7, dtype=np.int32) for _ in range(2))
        got = outcome(native.fill_bitmask, mine, batch, rows=rows)
        assert got == outcome(reference.fill_bitmask, theirs, batch, rows=rows)
        assert np.array_equal(mine, theirs)
    for row in (0, 1, -1, len(chosen) + 1, odd):
        mine, theirs = (np.full((len(chosen) + 1, width), 7, dtype=np.int32) for _ in range(2))
        state = chosen[0]
        assert outcome(native.fill_row, mine, state, row) == outcome(reference.fill_row, theirs, state, row)
        assert np.array_equal(mine, theirs)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    table=st.lists(words.filter(bool), min_size=1, max_size=12),
    singles=st.booleans(),
    values=st.lists(words, min_size=1, max_size=10),
    eos=st.booleans(),
)
def test_compile_loops_equal_reference(
    table: list[bytes], singles: bool, values: list[bytes], eos: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random vocabularies (duplicate byte strings, missing single bytes: the pruning path)."""
    tokens: list[bytes | None] = [*table, *([bytes([b]) for b in ALPHABET] if singles else []), None]
    vocab = Vocabulary(tokens, eos_token_ids=[len(tokens) - 1])
    try:
        twins(vocab, values, monkeypatch, eos=eos)
    except TriemaskError as error:  # the same error from both
        with monkeypatch.context() as patch:
            patch.setattr(_kernels, "KERNELS", None)
            with pytest.raises(type(error)) as again:
                Compiler(vocab).compile(values, eos=eos)
        assert str(again.value) == str(error)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    pieces=st.lists(words.filter(bool), min_size=1, max_size=12),
    values=st.lists(words, min_size=1, max_size=10),
    pattern=st.lists(st.sampled_from(["a", "b", "c", "ab", "(a|bc)", "[ab]", "c?", "(ab|a)"]), max_size=4),
)
def test_piece_edges_equal_reference(
    pieces: list[bytes], values: list[bytes], pattern: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mixed schema's second token table (its token pieces, duplicates included) matched
    against a field's trie and a pattern's automaton: the C matching's edges are the
    reference's, array for array."""
    compiler = Compiler(byte_vocabulary([b"ab", b"bc"]))
    index = TokenIndex(Vocabulary(pieces, eos_token_ids=None))
    regex = "".join(pattern) or "a"
    native = (compiler.compile_matching(values, index)[1], compiler.compile_pattern_matching(regex, index)[1])
    with monkeypatch.context() as patch:
        patch.setattr(_kernels, "KERNELS", None)
        reference = (compiler.compile_matching(values, index)[1], compiler.compile_pattern_matching(regex, index)[1])
    for mine, theirs in zip(native, reference, strict=True):
        for a, b in zip(mine, theirs, strict=True):
            assert a.dtype == b.dtype and np.array_equal(a, b)


def test_real_vocabulary_compiles_identically(monkeypatch: pytest.MonkeyPatch) -> None:
    from conftest import real_vocabulary
    from triemask.datasets import load_icd10cm, synthetic_tools

    vocab = real_vocabulary("qwen2").vocab
    twins(vocab, [v.encode() for v in synthetic_tools(3_000)], monkeypatch)
    twins(vocab, [v.encode() for v in load_icd10cm()[:5_000]], monkeypatch, eos=False)


def test_bitmasks_the_kernel_defers(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    native, reference = twins(byte_vocabulary(), [b"ab", b"b"], monkeypatch)
    width = allocate_token_bitmask(1, native.vocab_size).shape[1]
    buffers = [
        lambda: np.zeros((2, width), dtype=np.int32)[:, ::1],
        lambda: np.zeros((2, width), dtype=np.uint32),
        lambda: np.zeros((2, width), dtype=np.float32),
        lambda: np.zeros((2, width + 1), dtype=np.int32),
        lambda: np.zeros((2, 2 * width), dtype=np.int32)[:, ::2],
        lambda: np.zeros((width,), dtype=np.int32),
        lambda: torch.zeros((2, width), dtype=torch.int32),
        lambda: np.zeros((2, width), dtype=np.int32).T.copy().T,
        # the per-step fill reads exact int32 ndarrays' headers; these others take the buffer path
        lambda: np.zeros((2, width), dtype=">i4"),
        lambda: np.zeros((2, width), dtype=np.int32).view(_Subclass),
        lambda: np.zeros((0, width), dtype=np.int32),
        lambda: np.zeros((2, width), dtype=np.dtype("i4").newbyteorder("=")),
        lambda: np.zeros((2, width), dtype=np.intc),
        lambda: np.zeros(2 * width + 1, dtype=np.int32)[1:].reshape(2, width),  # not aligned to 8, still int32
    ]
    read_only = np.zeros((2, width), dtype=np.int32)
    read_only.flags.writeable = False
    buffers.append(lambda: read_only)
    for make in buffers:
        mine, theirs = make(), make()
        assert outcome(native.fill_bitmask, mine, [0]) == outcome(reference.fill_bitmask, theirs, [0])
        assert outcome(native.fill_bitmask, mine, [0, 1] * 20) == outcome(reference.fill_bitmask, theirs, [0, 1] * 20)
        assert np.array_equal(np.asarray(mine), np.asarray(theirs))
        mine, theirs = make(), make()
        assert outcome(Matcher(native).fill_next_token_bitmask, mine, 1) == outcome(
            Matcher(reference).fill_next_token_bitmask, theirs, 1
        )
        assert np.array_equal(np.asarray(mine), np.asarray(theirs))


class _Subclass(np.ndarray):
    pass


def test_matchers_agree_and_pickle(monkeypatch: pytest.MonkeyPatch) -> None:
    import pickle

    native, reference = twins(byte_vocabulary([b"get", b"_user"]), [b"get", b"get_user", b"set"], monkeypatch)
    ours, theirs = Matcher(native), Matcher(reference)
    width = allocate_token_bitmask(1, native.vocab_size).shape[1]
    for token in [*b"ge", 256, 257, True, -5, *b"t_user", 999_999]:
        a, b = np.zeros((2, width), dtype=np.int32), np.zeros((2, width), dtype=np.int32)
        ours.fill_next_token_bitmask(a, 1)
        theirs.fill_next_token_bitmask(b, 1)
        assert np.array_equal(a, b)
        assert ours.accept_token(token) == theirs.accept_token(token) and ours.state == theirs.state
    # keywords and odd arguments go through the C cores to the reference: the same results and errors
    a, b = np.zeros((2, width), dtype=np.int32), np.zeros((2, width), dtype=np.int32)
    ours.fill_next_token_bitmask(bitmask=a, row=1)
    theirs.fill_next_token_bitmask(bitmask=b, row=1)
    assert np.array_equal(a, b)
    for bad in (np.zeros((2, width + 1), dtype=np.int32), [[0] * width]):
        assert outcome(ours.fill_next_token_bitmask, bad) == outcome(theirs.fill_next_token_bitmask, bad)
    assert outcome(ours.fill_next_token_bitmask, a, 5) == outcome(theirs.fill_next_token_bitmask, b, 5)
    assert native.next_state(state=0, token_id=103) == reference.next_state(0, 103) != -1
    with pytest.raises(TypeError, match=r"next_state\(\) takes 2 arguments \(state, token_id\), got 1"):
        native.next_state(0)
    with pytest.raises(TypeError, match=r"accept_token\(\) takes 1 argument \(token_id\), got 0"):
        ours.accept_token()
    native.fill_bitmask(a, states=[0], rows=None)
    reference.fill_bitmask(b, [0])
    assert np.array_equal(a, b)
    restored = pickle.loads(pickle.dumps(ours))
    assert restored.value == ours.value == b"get_user"
    assert _automaton.native_kernel(restored.automaton) is not None


@pytest.mark.parametrize(
    "environment",
    [{"TRIEMASK_NATIVE": "0"}, {"TRIEMASK_BLOCK_NATIVE": "1"}],  # switched off; extension missing
)
def test_fallbacks_give_the_same_masks(environment: dict[str, str]) -> None:
    script = """
import os, sys, hashlib
if os.environ.get("TRIEMASK_BLOCK_NATIVE"):
    sys.modules["triemask.base._native"] = None  # as if built without a C compiler
import numpy as np
from triemask import Compiler, Matcher, Vocabulary, allocate_token_bitmask
from triemask.base import kernels as _kernels
from triemask.vocab import TokenIndex
vocab = Vocabulary([bytes([b]) for b in range(256)] + [b"ab", b"abc", None], eos_token_ids=258)
automaton = Compiler(vocab).compile(["abc", "abd", "b", "xyz"])
bitmask = allocate_token_bitmask(4, vocab.vocab_size)
automaton.fill_bitmask(bitmask, [0, 1, automaton.next_state(0, 256), -1])
digest = hashlib.sha256(bitmask.tobytes()).hexdigest()
matcher = Matcher(automaton)
row = allocate_token_bitmask(1, vocab.vocab_size)
accepted = []
for token in (97, 98, 1.5, 99, 97, 258):
    matcher.fill_next_token_bitmask(row)
    accepted.append(matcher.accept_token(token))
    digest += hashlib.sha256(row.tobytes()).hexdigest()[:8]
pairs = automaton.allowed_token_pairs([0, 3, -1])
print(_kernels.NATIVE, type(matcher).__mro__[1].__name__, digest, automaton.next_states([0, 0], [97, 256]).tolist(),
      accepted, matcher.value, pairs[0].tolist(), pairs[1].tolist())
"""
    env = {**os.environ, **environment}
    fallback = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    native = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    # the Python cores of Matcher and TrieAutomaton without the extension, the C ones with it
    assert fallback.stdout.split()[:2] == ["False", "_MatcherCore"] and native.stdout.split()[:2] == [
        "True",
        "MatcherCore",
    ]
    assert fallback.stdout.split()[2:] == native.stdout.split()[2:]


@settings(max_examples=300, deadline=None)
@given(data=st.binary(min_size=36, max_size=200))
def test_kernel_fuzz_target(data: bytes) -> None:
    """tests/fuzz_native.py's target (run with atheris by hand), briefly."""
    from fuzz_native import kernel_target

    kernel_target(data)


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 6), min_size=5, max_size=5),
    data=st.data(),
)
def test_kernel_rejects_inconsistent_arrays(sizes: list[int], data: st.DataObject) -> None:
    """A fuzz of the kernel's inputs: arbitrary arrays either build a kernel whose every
    call stays in bounds, or are refused with ValueError; never a crash."""
    from fuzz_native import exercise_kernel

    ints = st.integers(-3, 8)
    arrays = [np.asarray(data.draw(st.lists(ints, min_size=n, max_size=n)), dtype=np.int32) for n in sizes]
    num_nodes, num_states = data.draw(st.integers(0, 4)), data.draw(st.integers(0, 8))
    values = np.asarray(data.draw(st.lists(ints, min_size=3, max_size=6)), dtype=np.int32)
    exercise_kernel(arrays, num_nodes, num_states, data.draw(st.integers(1, 4)), values, data.draw(st.integers(0, 3)))


def test_threads_share_one_automaton(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch calls release the GIL: threads filling from one automaton at once get the
    reference's rows."""
    from concurrent.futures import ThreadPoolExecutor

    native, reference = twins(byte_vocabulary([b"ab", b"abc"]), [b"abc", b"abd", b"b", b"xyz", b""], monkeypatch)
    states = [s % native.num_states for s in range(200)]
    expected = allocate_token_bitmask(len(states), native.vocab_size)
    reference.fill_bitmask(expected, states)
    expected_next = reference.next_states(states, [97] * len(states))

    def work(seed: int) -> bool:
        bitmask = allocate_token_bitmask(len(states), native.vocab_size)
        same = True
        for _ in range(50):
            native.fill_bitmask(bitmask, states)
            same &= np.array_equal(bitmask, expected)
            same &= np.array_equal(native.next_states(states, [97] * len(states)), expected_next)
        return same

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(work, range(8)))


def test_no_packed_key_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """(source, token, destination) do not fit 64 bits for 10,000 values against 2**31 - 1
    logits: the C compiler lays the edges out, and the NumPy one sorts two-column keys,
    to the same arrays."""
    vocab = Vocabulary([bytes([b]) for b in range(256)] + [None], eos_token_ids=256, vocab_size=2**31 - 1)
    rng = np.random.default_rng(0)
    large = sorted({"".join(chr(c) for c in rng.integers(97, 123, 10)) for _ in range(10_000)})
    automaton, reference = twins(vocab, large, monkeypatch)
    for compiled in (automaton, reference):
        matcher = Matcher(compiled)
        assert matcher.accept_tokens([*large[123].encode(), 256]) == 11 and matcher.value == large[123]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    strings=st.lists(
        st.binary(max_size=6).map(lambda b: bytes(b"ab\x00\xff"[x % 4] for x in b)), min_size=1, max_size=14
    )
)
def test_trie_construction_equals_reference(strings: list[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    """The C trie (one sort, one pass) against _trie.build_trie's NumPy construction: NUL
    and 0xFF bytes, empty strings, duplicates, with and without the inverse."""
    from triemask.base.trie import build_trie

    flat = np.frombuffer(b"".join(strings), dtype=np.uint8)
    starts = np.zeros(len(strings) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in strings], out=starts[1:])
    for inverse in (False, True):
        native = build_trie(flat, starts, return_inverse=inverse)
        with monkeypatch.context() as patch:
            patch.setattr(_kernels, "KERNELS", None)
            reference = build_trie(flat, starts, return_inverse=inverse)
        for field in ("parent", "byte", "level_offsets", "terminal", "flat", "starts", "inverse"):
            mine, theirs = getattr(native, field), getattr(reference, field)
            assert (mine is None) == (theirs is None), field
            if mine is not None:
                assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs), field


def test_large_trie_construction_equals_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Above 1,024 strings the C sort is a radix sort: long shared prefixes, prefixes of one
    another, NUL and 0xFF bytes, duplicates and empty strings, against the NumPy trie."""
    from triemask.base.trie import build_trie

    rng = np.random.default_rng(7)
    stems = [bytes(rng.integers(0, 256, int(rng.integers(0, 40)), dtype=np.uint8)) for _ in range(30)]
    strings = [
        stems[int(rng.integers(0, 30))] + bytes(rng.choice([0, 1, 97, 255], int(rng.integers(0, 6))).astype(np.uint8))
        for _ in range(6_000)
    ]
    strings += [b"", b"x" * 3_000, b"x" * 2_999 + b"y", *strings[:50]]
    flat = np.frombuffer(b"".join(strings), dtype=np.uint8)
    starts = np.zeros(len(strings) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in strings], out=starts[1:])
    native = build_trie(flat, starts, return_inverse=True)
    with monkeypatch.context() as patch:
        patch.setattr(_kernels, "KERNELS", None)
        reference = build_trie(flat, starts, return_inverse=True)
    for field in ("parent", "byte", "level_offsets", "terminal", "flat", "starts", "inverse"):
        assert np.array_equal(getattr(native, field), getattr(reference, field)), field


def test_token_index_tables_equal_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """The C-built trie and hash table answer every transition as the NumPy-built ones."""
    from conftest import real_vocabulary
    from triemask.vocab.token_index import TokenIndex

    vocab = real_vocabulary("mistral-spm-32k").vocab
    native = TokenIndex(vocab)
    with monkeypatch.context() as patch:
        patch.setattr(_kernels, "KERNELS", None)
        reference = TokenIndex(vocab)
    for field in ("first_token", "has_children", "dense", "level_offsets", "child_offsets", "node_byte"):
        assert np.array_equal(getattr(native, field), getattr(reference, field)), field
    rng = np.random.default_rng(0)
    levels = native.level_offsets
    for level in range(native.dense_levels, len(levels) - 2):
        nodes = np.arange(levels[level], levels[level + 1], dtype=np.int32)
        for byte in rng.integers(0, 256, 8).astype(np.uint8):
            bytes_ = np.full(len(nodes), byte, dtype=np.uint8)
            assert np.array_equal(native.step(nodes, bytes_, level), reference.step(nodes, bytes_, level))
        children = np.arange(native.child_offsets[levels[level]], native.child_offsets[levels[level + 1]])
        parents = np.repeat(nodes, np.diff(native.child_offsets[levels[level] : levels[level + 1] + 1]))
        assert np.array_equal(native.step(parents, native.node_byte[children], level), children)


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(st.text(alphabet="abc_é", max_size=6), min_size=1, max_size=12, unique=True),
    changes=st.lists(
        st.tuples(st.sampled_from(["token", "dest"]), st.integers(0, 10**6), st.integers(-3, 400)), max_size=3
    ),
)
def test_spelled_edges_equals_reference(values: list[str], changes: list[tuple[str, int, int]]) -> None:
    """The C check that a file's edges spell its values' paths gives the NumPy reference's
    answer (the first bad edge, or -1) on intact and on altered edges, whatever they hold."""
    from triemask.base.trie import build_trie

    native = _kernels.KERNELS
    assert native is not None
    vocab = byte_vocabulary([b"ab", b"_a", b"\xc3\xa9", b"c_"])
    automaton = Compiler(vocab).compile(values)
    _, _, arrays = automaton.file_parts()
    tokens, dests = arrays["edge_tokens"].copy(), arrays["edge_dests"].copy()
    for which, at, value in changes:
        target = tokens if which == "token" else dests
        if len(target):
            target[at % len(target)] = value
    trie = build_trie(arrays["value_flat"], arrays["value_starts"])
    lengths, offsets, data = vocab.byte_table()
    eos = np.asarray(vocab.eos_token_ids, dtype=np.int32)
    parts = (trie.parent, trie.byte, arrays["edge_offsets"], tokens, dests, lengths, offsets, data, trie.terminal, eos)
    expected = checks.first_misspelled_edge(*parts)
    assert native.spelled_edges(*parts) == expected
    if not changes:
        assert expected == -1
