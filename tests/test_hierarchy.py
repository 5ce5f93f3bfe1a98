"""Hierarchical rewriting and shortlists (triemask.hierarchy): whatever a decoder writes
through their automata, the answer is a member of the full set."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import byte_vocabulary
from triemask import Compiler, Matcher, TrieAutomaton, ValueSetError
from triemask.datasets import synthetic_tools
from triemask.hierarchy import Hierarchy, Shortlist, recall_at_k

words = st.text(alphabet="abc_é", min_size=0, max_size=6)


def random_output(automaton: TrieAutomaton, rng: random.Random) -> str:
    """Walk the automaton with random allowed tokens to a final state: any decoder's output."""
    matcher = Matcher(automaton)
    while not matcher.is_terminated():
        assert matcher.accept_token(rng.choice(matcher.allowed_token_ids().tolist()))
    value = matcher.value
    assert isinstance(value, str)
    return value


def check_partition(hierarchy: Hierarchy, values: list[str]) -> None:
    members = [m for group in hierarchy.groups.values() for m in group]
    assert sorted(members) == sorted(set(values)) and len(members) == len(set(members))
    assert len(hierarchy.rewritten) == len(members)
    for label, group in hierarchy.groups.items():
        for member in group:
            assert hierarchy.member(label + hierarchy.separator + member) == member
    assert hierarchy.cardinality == max(len(hierarchy.groups), max(map(len, hierarchy.groups.values())))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(words, min_size=1, max_size=40), size=st.integers(1, 8), seed=st.integers(0, 99))
def test_prefix_hierarchy_decodes_only_members(values: list[str], size: int, seed: int) -> None:
    hierarchy = Hierarchy.by_prefix(values, group_size=size)
    check_partition(hierarchy, values)
    automaton = hierarchy.compile(Compiler(byte_vocabulary()))
    rng = random.Random(seed)
    for _ in range(10):
        assert hierarchy.member(random_output(automaton, rng)) in set(values)


def test_prefix_groups_are_about_sqrt_k() -> None:
    values = synthetic_tools(10_000)
    hierarchy = Hierarchy.by_prefix(values)
    check_partition(hierarchy, values)
    stats = hierarchy.stats()
    assert stats["sqrt_k"] == 100 and stats["cardinality"] < 3 * stats["sqrt_k"]
    assert all(value.startswith(label) for label, group in hierarchy.groups.items() for value in group)
    # long shared prefixes nest as deep as the strings: no recursion limit
    deep = ["a" * n for n in range(1, 3_000)]
    check_partition(Hierarchy.by_prefix(deep, group_size=5), deep)


def test_taxonomy_hierarchy() -> None:
    codes = ["I21.4", "I10", "J45.909", "J45.20", "A00.0"]
    hierarchy = Hierarchy.by_taxonomy(codes, lambda code: f"chapter {code[0]}", separator=": ")
    check_partition(hierarchy, codes)
    assert hierarchy.groups["chapter J"] == ["J45.909", "J45.20"] and hierarchy.cardinality == 3
    automaton = hierarchy.compile(Compiler(byte_vocabulary()), eos=True)
    rng = random.Random(0)
    assert {hierarchy.member(random_output(automaton, rng)) for _ in range(200)} == set(codes)


def test_embedding_hierarchy_recovers_clusters_and_measures_coherence() -> None:
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(4, 16)) * 5
    labels = np.repeat(np.arange(4), 25)
    vectors = centres[labels] + rng.normal(size=(100, 16))
    values = [f"v{i}" for i in range(100)]
    hierarchy = Hierarchy.by_embeddings(values, vectors, groups=4, seed=1)
    check_partition(hierarchy, values)
    found = {frozenset(int(v[1:]) // 25 for v in group) for group in hierarchy.groups.values()}
    assert found == {frozenset({0}), frozenset({1}), frozenset({2}), frozenset({3})}
    assert all(label in group for label, group in hierarchy.groups.items())  # labels are members
    order = [int(v[1:]) for v in hierarchy.values]
    assert hierarchy.coherence(vectors[order]) > 0.95
    described = Hierarchy.by_embeddings(values, vectors, groups=4, seed=1, describe=lambda v: "same")
    assert sorted(described.groups) == ["same", "same (2)", "same (3)", "same (4)"]  # equal labels told apart
    check_partition(described, values)
    noise = Hierarchy.by_taxonomy(values, lambda v: str(int(v[1:]) % 4))  # groups across the clusters
    assert noise.coherence(vectors[[int(v[1:]) for v in noise.values]]) < 0.7


def test_hierarchy_errors_name_the_value() -> None:
    with pytest.raises(ValueSetError, match="'x' is in two groups: 'a' and 'b'"):
        Hierarchy({"a": ["x"], "b": ["x", "y"]})
    with pytest.raises(ValueSetError, match="separator"):
        Hierarchy({"a": ["x"]}, separator="")
    with pytest.raises(ValueSetError, match=r"one row per distinct value: shape \(2, d\), got \(3, 4\)"):
        Hierarchy.by_embeddings(["a", "b"], np.zeros((3, 4)))
    with pytest.raises(ValueSetError, match="groups must lie in"):
        Hierarchy.by_embeddings(["a", "b"], np.eye(2), groups=3)
    with pytest.raises(ValueSetError, match="value #1 is int"):
        Hierarchy.by_prefix(["a", 3])  # type: ignore[list-item]
    with pytest.raises(KeyError, match="not a value"):
        Hierarchy.by_prefix(["a"]).member("b")


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(words, min_size=1, max_size=30, unique=True),
    k=st.integers(1, 6),
    seed=st.integers(0, 999),
)
def test_shortlist_cascade_always_ends_in_a_member(values: list[str], k: int, seed: int) -> None:
    rng = random.Random(seed)
    scores = [rng.random() for _ in values]
    shortlist = Shortlist(values, scores, k=k, none="NONE")
    compiler = Compiler(byte_vocabulary())
    stages_seen = []

    def decode(allowed: list[str]) -> str:  # any decoder, constrained to the stage's set
        stages_seen.append(len(allowed))
        return random_output(compiler.compile(allowed), rng)

    member, stage = shortlist.run(decode)
    assert member in set(values) and stage == len(stages_seen) - 1
    assert shortlist.stage_values(shortlist.num_stages - 1) == values  # the last stage: the full set
    first = shortlist.stage_values(0)
    if shortlist.num_stages > 1:
        ranked = sorted(values, key=lambda v: -scores[values.index(v)])
        assert first == [*ranked[:k], "NONE"]


def test_shortlist_rules_and_errors() -> None:
    values = [f"v{i}" for i in range(100)]
    scores = np.arange(100)[::-1].astype(float)  # v0 best
    shortlist = Shortlist(values, scores, k=10)
    assert shortlist.stage_sizes == [10, 20, 100] and shortlist.num_stages == 3
    assert shortlist.resolve(0, "none of these") is None and shortlist.resolve(0, "v3") == "v3"
    with pytest.raises(ValueSetError, match="not a value of stage 0"):
        shortlist.resolve(0, "v50")
    with pytest.raises(ValueSetError, match="not a value of stage 2"):
        shortlist.resolve(2, "none of these")  # the full set has no way out
    with pytest.raises(ValueSetError, match="must be a str that is not a value"):
        Shortlist(values, scores, none="v1")
    with pytest.raises(ValueSetError, match=r"one entry per distinct value"):
        Shortlist(values, scores[:5])
    with pytest.raises(ValueSetError, match="NaN at value #2"):
        Shortlist(values, np.where(np.arange(100) == 2, np.nan, 1.0))
    assert recall_at_k(values, ["v0", "v99"], np.tile(scores, (2, 1)), 10) == 0.5
