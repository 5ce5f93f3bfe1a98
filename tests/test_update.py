"""Incremental updates: automaton.with_values(added, removed) equals a full recompile."""

from __future__ import annotations

import gc
import pickle
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import byte_vocabulary, real_compiler
from triemask import (
    DEAD,
    ArgumentTypeError,
    Compiler,
    Matcher,
    StateError,
    TrieAutomaton,
    UpdatedTrieAutomaton,
    ValueSetError,
    Vocabulary,
)
from triemask.base import kernels
from triemask.sets import update as _update

LETTERS = "ab_c"
values_strategy = st.text(alphabet=LETTERS, min_size=0, max_size=6)


def bytes_last_vocabulary(merges: list[bytes]) -> Vocabulary:
    """The merges first, then EOS, then every single byte, and "a" again: byte tokens with the
    highest ids and EOS not the last (byte_vocabulary's order reversed), a byte spelled twice."""
    table: list[bytes | None] = [*merges, None, *(bytes([b]) for b in range(256)), b"a"]
    return Vocabulary(table, eos_token_ids=[len(merges)], vocab_size=len(table) + 3)


def assert_equal_languages(updated: TrieAutomaton, fresh: TrieAutomaton) -> None:
    """Walk both automata together from their initial states over every allowed token: the
    same tokens allowed, the same acceptance and values, at every reachable pair of states."""
    seen = set()
    stack = [(updated.initial_state, fresh.initial_state)]
    width = (fresh.vocab_size + 31) // 32
    rows = np.zeros((2, width), dtype=np.int32)
    while stack:
        pair = stack.pop()
        if pair in seen:
            continue
        seen.add(pair)
        u, f = pair
        allowed = fresh.allowed_token_ids(f)
        assert np.array_equal(updated.allowed_token_ids(u), allowed), (u, f)
        updated.fill_bitmask(rows, [u], rows=[0])
        fresh.fill_bitmask(rows, [f], rows=[1])
        assert np.array_equal(rows[0], rows[1])
        assert updated.is_accepting(u) == fresh.is_accepting(f)
        assert updated.is_final(u) == fresh.is_final(f)
        assert updated.value_of(u) == fresh.value_of(f)
        stack += [(updated.next_state(u, token), fresh.next_state(f, token)) for token in allowed.tolist()]
        outside = fresh.vocab_size - 1  # a token neither allows here (the padding id)
        assert updated.next_state(u, outside) == DEAD or fresh.next_state(f, outside) != DEAD
    assert updated.values() == fresh.values()
    assert updated.num_values == fresh.num_values
    assert updated.set_fingerprint == fresh.set_fingerprint


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base=st.lists(values_strategy, min_size=1, max_size=12),
    steps=st.lists(
        st.tuples(st.lists(values_strategy, max_size=4), st.lists(st.integers(0, 30), max_size=4)),
        min_size=1,
        max_size=4,
    ),
    eos=st.booleans(),
    merges=st.lists(st.text(alphabet=LETTERS, min_size=2, max_size=4), max_size=8),
    bytes_last=st.booleans(),
)
def test_random_updates_equal_full_recompiles(
    base: list[str], steps: list[tuple[list[str], list[int]]], eos: bool, merges: list[str], bytes_last: bool
) -> None:
    """Hypothesis: random add/remove sequences on random sets, merged at lookup (the compaction
    threshold lifted), equal a recompile of the resulting set at every reachable state; on a
    vocabulary with the single bytes first and EOS last, or the other way round (the C walks
    look for byte tokens from a node's first edge, and for EOS at its last)."""
    saved = _update.COMPACT_FRACTION
    _update.COMPACT_FRACTION = 10.0
    try:
        encoded = [m.encode() for m in merges]
        compiler = Compiler(
            bytes_last_vocabulary(encoded) if bytes_last else byte_vocabulary(encoded), disk_cache=False
        )
        automaton = compiler.compile(base, eos=eos)
        current = set(base)
        for added, picks in steps:
            members = sorted(current)
            removed = sorted({members[i % len(members)] for i in picks}) if members else []
            expected = (current - set(removed)) | set(added)
            if not expected:
                with pytest.raises(ValueSetError, match="empty set"):
                    automaton.with_values(added=added, removed=removed, compiler=compiler)
                return
            automaton = automaton.with_values(added=added, removed=removed, compiler=compiler)
            current = expected
            assert_equal_languages(automaton, compiler.compile(sorted(current), eos=eos))
    finally:
        _update.COMPACT_FRACTION = saved


def test_an_update_is_merged_at_lookup_and_compacts_on_demand() -> None:
    compiler = real_compiler("qwen2")
    rng = random.Random(1)
    values = [
        f"{ns}.{verb}_{noun}"
        for ns in ("slack", "jira", "github")
        for verb in ("get", "put", "list")
        for noun in ("user", "issue", "file", "team", "channel", "project")
    ]
    values += [f"tool_{i:04d}" for i in range(2000)]
    base = compiler.compile(values)
    removed = [*rng.sample(values, 30), "slack.get_user"]
    added = ["slack.get_users", "slack.get_user_by_email", "tool_99999", "naïve.café", "slack.get_use"]
    updated = base.with_values(added=added, removed=sorted(set(removed)))
    assert isinstance(updated, UpdatedTrieAutomaton)
    expected = sorted((set(values) - set(removed)) | set(added))
    fresh = compiler.compile(expected)
    assert_equal_languages(updated, fresh)
    stats = updated.stats()
    assert stats["added"] == len(added) and stats["removed"] == len(set(removed)) and stats["cut_nodes"] > 0
    matcher = Matcher(updated)
    assert (
        matcher.accept_tokens(compiler.vocab.encode("slack.get_users") if hasattr(compiler.vocab, "encode") else [])
        >= 0
    )
    again = updated.with_values(removed=["slack.get_users"], added=["slack.get_user"])  # chained, against the same base
    assert isinstance(again, UpdatedTrieAutomaton) and again.parts()[0] is base
    assert_equal_languages(again, compiler.compile(sorted((set(expected) - {"slack.get_users"}) | {"slack.get_user"})))
    compact = updated.compacted()
    assert type(compact) is TrieAutomaton and compact.values() == expected
    restored = pickle.loads(pickle.dumps(updated))  # saved and pickled as its compacted form
    assert type(restored) is TrieAutomaton and restored.values() == expected
    assert base.values() == sorted(set(values))  # the base is unchanged


def test_large_changes_and_vocabularies_without_byte_tokens_recompile() -> None:
    compiler = Compiler(byte_vocabulary(), disk_cache=False)
    base = compiler.compile([f"v{i}" for i in range(100)])
    big = base.with_values(added=[f"w{i}" for i in range(10)], compiler=compiler)  # 10% > COMPACT_FRACTION
    assert type(big) is TrieAutomaton and big.num_values == 110
    small = base.with_values(added=["w0"], compiler=compiler)
    assert isinstance(small, UpdatedTrieAutomaton)
    lazy = compiler.compile(["a", "b"], layout="lazy").with_values(added=["c"], compiler=compiler)
    assert type(lazy).__name__ == "LazyTrieAutomaton" and lazy.values() == ["a", "b", "c"]
    table: list[bytes | None] = [b"a", b"b", b"ab", None]  # no token for most bytes
    sparse = Compiler(Vocabulary(table, eos_token_ids=3), disk_cache=False)
    updated = sparse.compile(["ab", "a"]).with_values(added=["b"], removed=["a"], compiler=sparse)
    assert type(updated) is TrieAutomaton and updated.values() == ["ab", "b"]


def test_bad_updates_are_named() -> None:
    compiler = Compiler(byte_vocabulary(), disk_cache=False)
    base = compiler.compile(["a", "b"])
    with pytest.raises(ValueSetError, match="removed value 'z' is not in the set"):
        base.with_values(removed=["z"], compiler=compiler)
    with pytest.raises(ValueSetError, match=r"added\[0\] is bytes b'c'; this set's values are str"):
        base.with_values(added=[b"c"], compiler=compiler)
    with pytest.raises(ValueSetError, match="wrap it in a list"):
        base.with_values(added="abc", compiler=compiler)
    with pytest.raises(ValueSetError, match="empty set"):
        base.with_values(removed=["a", "b"], compiler=compiler)
    assert base.with_values(added=["a"], compiler=compiler) is base  # nothing changes
    assert base.with_values(compiler=compiler) is base
    with pytest.raises(ArgumentTypeError, match="not the one this automaton was compiled for"):
        base.with_values(added=["c"], compiler=Compiler(byte_vocabulary([b"xy"]), disk_cache=False))
    with pytest.raises(ArgumentTypeError, match="not the language of a pattern"):
        compiler.compile_regex("a|b").with_values(added=["c"], compiler=compiler)
    updated = compiler.compile([f"v{i}" for i in range(100)]).with_values(added=["c"], compiler=compiler)
    with pytest.raises(ArgumentTypeError, match="call compacted"):
        updated.edge_arrays()
    with pytest.raises(ArgumentTypeError, match="call compacted"):
        updated.accepting_nodes  # noqa: B018
    with pytest.raises(StateError, match="is not a state of this automaton"):
        updated.allowed_token_ids(updated.num_states)
    orphan_vocab = byte_vocabulary([b"qq"])
    orphan = Compiler(orphan_vocab, disk_cache=False).compile(["q"])
    gc.collect()
    with pytest.raises(ArgumentTypeError, match="pass compiler=Compiler"):
        orphan.with_values(added=["r"])


@pytest.mark.parametrize("big", [False, True])
def test_batch_calls_equal_their_rows(big: bool) -> None:
    """next_states, allowed_token_pairs and fill_bitmask over a batch (one call per part)
    equal the same calls row by row, at live, cut, DEAD and final states. The states number
    the parts' states and the delta's nodes paired, not every pair: a base of 100,000 values
    with a delta of 2,000 (over 2**31 pairs) keeps int32 states and its C kernel."""
    compiler = Compiler(byte_vocabulary([b"ab", b"abc", b"_x"]), disk_cache=False)
    rng = random.Random(int(big))
    count, longest = (100_000, 14) if big else (400, 9)
    values = sorted({"".join(rng.choice("abc_x") for _ in range(rng.randint(1, longest))) for _ in range(count)})
    base = compiler.compile(values)
    removed = rng.sample(values, len(values) // 50)
    added = [f"{v}_new" for v in rng.sample(values, len(values) // 50)]
    updated = base.with_values(added=added, removed=removed)
    assert isinstance(updated, UpdatedTrieAutomaton)
    assert updated.num_states < 2**31 and (updated._kernel is not None) == (kernels.KERNELS is not None)
    # states met along the values' byte paths (rewritten nodes included), and DEAD
    byte_tokens = compiler.single_byte_tokens()
    states = {DEAD, updated.initial_state}
    for value in rng.sample(values, 40) + removed[:20] + added[:20]:
        state = updated.initial_state
        for byte in value.encode():
            state = updated.next_state(state, int(byte_tokens[byte]))
            states.add(state)
            if state == DEAD:
                break
        states.add(updated.next_state(state, compiler.vocab.eos_token_ids[0]) if state != DEAD else DEAD)
    batch = np.asarray(sorted(states), dtype=np.int64)
    tokens = np.asarray([rng.randrange(compiler.vocab.vocab_size) for _ in batch], dtype=np.int64)
    found = updated.next_states(batch, tokens)
    assert found.tolist() == [updated.next_state(int(s), int(t)) for s, t in zip(batch, tokens, strict=True)]
    assert found.dtype == np.int32
    rows, ids = updated.allowed_token_pairs(batch)
    for i, state in enumerate(batch.tolist()):
        assert ids[rows == i].tolist() == updated.allowed_token_ids(state).tolist()
    width = (compiler.vocab.vocab_size + 31) // 32
    together = np.full((len(batch) + 2, width), -1, dtype=np.int32)
    order = rng.sample(range(len(batch) + 2), len(batch))
    updated.fill_bitmask(together, batch, rows=order)
    alone = np.zeros((1, width), dtype=np.int32)
    for state, row in zip(batch.tolist(), order, strict=True):
        updated.fill_row(alone, state)
        assert np.array_equal(together[row], alone[0])
    with pytest.raises(StateError):
        updated.next_states(np.asarray([updated.num_states]), np.asarray([0]))


@pytest.mark.skipif(kernels.KERNELS is None, reason="the C extension is not built")
def test_the_c_lookups_equal_the_reference() -> None:
    """The C kernel over an updated set's parts (step, one-row fill, batch fill, batch step,
    pairs) against the Python reference merging the parts, at every state met along the
    values' paths and random tokens, rewritten nodes and DEAD included."""
    compiler = Compiler(byte_vocabulary([b"ab", b"abc", b"_x", b"c_"]), disk_cache=False)
    rng = random.Random(7)
    values = sorted({"".join(rng.choice("abc_x") for _ in range(rng.randint(1, 8))) for _ in range(600)})
    base = compiler.compile(values)
    removed, added = rng.sample(values, 8), [f"{v}c" for v in rng.sample(values, 8)] + ["zz", "a"]
    native = base.with_values(added=sorted(set(added) - set(values)), removed=removed)
    reference = base.with_values(added=sorted(set(added) - set(values)), removed=removed)
    assert isinstance(native, UpdatedTrieAutomaton) and native._kernel is not None
    reference._kernel = None
    assert native.stats()["cut_tokens"] > 0 and native.stats()["cut_nodes"] == reference.stats()["cut_nodes"]
    assert native.memory_bytes > reference.memory_bytes  # (the kernel's table counted)
    states, frontier = {DEAD}, [native.initial_state]
    while frontier and len(states) < 3_000:  # breadth-first over the reachable states
        state = frontier.pop(0)
        if state in states:
            continue
        states.add(state)
        frontier += [native.next_state(state, int(t)) for t in reference.allowed_token_ids(state).tolist()]
    states |= {rng.randrange(native.num_states) for _ in range(500)}  # (pairs no walk reaches, too)
    batch = np.asarray(sorted(states), dtype=np.int64)
    tokens = np.asarray([rng.randrange(compiler.vocab.vocab_size) for _ in batch], dtype=np.int64)
    assert native.next_states(batch, tokens).tolist() == reference.next_states(batch, tokens).tolist()
    for state in batch.tolist():
        for token in rng.sample(range(compiler.vocab.vocab_size), 8):
            assert native.next_state(state, token) == reference.next_state(state, token)
    width = (compiler.vocab.vocab_size + 31) // 32
    ours, theirs = np.zeros((len(batch), width), dtype=np.int32), np.ones((len(batch), width), dtype=np.int32)
    native.fill_bitmask(ours, batch)
    reference.fill_bitmask(theirs, batch)
    assert np.array_equal(ours, theirs)
    one = np.zeros((1, width), dtype=np.int32)
    for state, row in zip(batch.tolist(), theirs, strict=True):
        native.fill_row(one, state)
        assert np.array_equal(one[0], row)
    for found, expected in zip(native.allowed_token_pairs(batch), reference.allowed_token_pairs(batch), strict=True):
        assert found.tolist() == expected.tolist()
    matcher, byte_tokens = Matcher(native), compiler.single_byte_tokens()
    for value in [*rng.sample(sorted(set(values) - set(removed)), 20), "zz"]:
        matcher.reset()
        assert all(matcher.accept_token(int(byte_tokens[byte])) for byte in value.encode())
        assert matcher.value == value


@pytest.mark.skipif(kernels.KERNELS is None, reason="the C extension is not built")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    values=st.lists(values_strategy, min_size=1, max_size=40, unique=True),
    picks=st.lists(st.integers(0, 60), min_size=1, max_size=12),
    eos=st.booleans(),
    merges=st.lists(st.text(alphabet=LETTERS, min_size=2, max_size=4), max_size=8),
    bytes_last=st.booleans(),
)
def test_the_c_walks_and_tombstones_equal_the_reference(
    values: list[str], picks: list[int], eos: bool, merges: list[str], bytes_last: bool
) -> None:
    """with_values's two passes over the base, walk_paths and tombstone_edges in C, against
    the NumPy reference (KERNELS off) on random sets and removals: the walks of the removed
    values and of others (prefixes, extensions, strangers: no value at their end), then the
    cut pass over the removed ones; the partners of a delta of the others."""
    encoded = [m.encode() for m in merges]
    vocab = bytes_last_vocabulary(encoded) if bytes_last else byte_vocabulary(encoded)
    compiler = Compiler(vocab, disk_cache=False)
    base = compiler.compile(values, eos=eos)
    removed = sorted({values[i % len(values)] for i in picks})
    others = sorted(({v[:-1] for v in removed} | {f"{v}a" for v in removed} | {"zz", ""}) - set(values))
    byte_tokens = compiler.single_byte_tokens()
    delta = compiler.compile(others, eos=eos)  # (the values not in the base, added)
    native = kernels.KERNELS
    found = {}
    for name, table in (("c", native), ("reference", None)):
        kernels.KERNELS = table
        try:
            paths, lengths, ends = _update._walks(base, removed + others, byte_tokens)
            cut, indices = _update._tombstones(base, paths[: len(removed)], lengths[: len(removed)], byte_tokens)
            partner = _update._partners(delta, others, byte_tokens, paths[len(removed) :])
        finally:
            kernels.KERNELS = native
        assert (ends[: len(removed)] >= 0).all() and (ends[len(removed) :] == -1).all()
        found[name] = (
            paths.tolist(),
            lengths.tolist(),
            ends.tolist(),
            [a.tolist() for a in vars(cut).values()],
            indices.tolist(),
            partner.tolist(),
        )
    assert found["c"] == found["reference"]


def test_single_byte_tokens_are_found_once_and_read_only() -> None:
    """The table an update reads is the compiler's own (no vocabulary scan per update), and no
    caller can change it under the next update."""
    compiler = Compiler(byte_vocabulary([b"ab"]), disk_cache=False)
    found = compiler.single_byte_tokens()
    assert found is compiler.single_byte_tokens()
    assert found[ord("a")] >= 0 and not found.flags.writeable
    with pytest.raises(ValueError):
        found[0] = 5


@pytest.mark.skipif(kernels.KERNELS is None, reason="the C extension is not built")
def test_the_c_update_passes_refuse_what_is_not_theirs() -> None:
    """walk_paths, tombstone_edges, partner_nodes and updated_kernel check what they are given
    (a ValueError or TypeError, never a read out of bounds): walks leaving the trie or ending
    where no value does, nodes out of range, tables of the wrong size, unsorted cut tokens,
    partners out of range."""
    native = kernels.KERNELS
    compiler = Compiler(byte_vocabulary([b"ab"]), disk_cache=False)
    base, delta = compiler.compile(["ab", "abc", "b"]), compiler.compile(["abd"])
    kernel, delta_kernel = base._kernel, delta._kernel
    byte_tokens = compiler.single_byte_tokens()
    ends = _update._value_ends(base)
    single = _update._single(byte_tokens)
    eos = np.asarray(base.eos_token_ids, dtype=np.int64)
    paths, lengths, found = _update._walks(base, ["ab", "abd"], byte_tokens)
    assert found.tolist()[0] >= 0 and found.tolist()[1] == -1  # ("abd" leaves the trie)
    with pytest.raises(ValueError):
        native.walk_paths(kernel, [b"ab", "ab"], byte_tokens, base.initial_state, *ends)
    with pytest.raises(ValueError):
        native.walk_paths(kernel, [b"ab"], byte_tokens[:255], base.initial_state, *ends)
    with pytest.raises(ValueError):
        native.walk_paths(kernel, [b"ab"], byte_tokens, base.num_nodes, *ends)

    def tombstones(walks: np.ndarray, walk_lengths: np.ndarray) -> object:
        return native.tombstone_edges(kernel, walks, walk_lengths, single, eos, *ends, base.initial_state)

    assert len(tombstones(paths[:1], lengths[:1])) == 4
    for walks, walk_lengths in (
        (paths[1:], lengths[1:]),  # leaves the trie
        (paths[:1], lengths[:1] - 1),  # ends where no value does ("a")
        (np.where(paths[:1] >= 0, base.num_nodes + 5, paths[:1]), lengths[:1]),  # nodes out of range
        (paths[:1], lengths[:1] + 5),  # longer than its row
    ):
        with pytest.raises(ValueError):
            tombstones(np.ascontiguousarray(walks), np.ascontiguousarray(walk_lengths))
    with pytest.raises(ValueError):  # a walk narrower than its value
        native.partner_nodes(delta_kernel, [b"abd"], byte_tokens, np.zeros((1, 3), dtype=np.int64))
    partner = native.partner_nodes(delta_kernel, [b"abd"], byte_tokens, paths[1:])
    assert np.frombuffer(partner, dtype=np.int32).tolist()[:3] == paths[1, :3].tolist()
    cut = [np.asarray(a, dtype=np.int32) for a in ([1], [0, 2], [5, 3])]  # tokens unsorted
    fine = np.frombuffer(partner, dtype=np.int32)
    num_states = base.num_states + delta.num_states + delta.num_nodes
    with pytest.raises(ValueError):
        native.updated_kernel(kernel, delta_kernel, *cut, fine, num_states)
    cut[2] = np.asarray([3, 5], dtype=np.int32)
    assert native.updated_kernel(kernel, delta_kernel, *cut, fine, num_states) is not None
    for wrong, states in ((np.full_like(fine, base.num_nodes), num_states), (fine[:-1], num_states), (fine, 7)):
        with pytest.raises(ValueError):
            native.updated_kernel(kernel, delta_kernel, *cut, wrong, states)
