"""Pickles and files written before the layered layout (triemask 0.1.0, tests/data/v0_layout,
made by the flat modules) still load, and give the masks of the same sets compiled now."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from triemask import CompiledSchema, Compiler, DagAutomaton, LazyTrieAutomaton, Matcher, TrieAutomaton, Vocabulary

DATA = Path(__file__).parent / "data" / "v0_layout"


def _vocabulary() -> Vocabulary:
    spec = json.loads((DATA / "vocabulary.json").read_text())
    return Vocabulary([None if t is None else bytes.fromhex(t) for t in spec["tokens"]], eos_token_ids=spec["eos"])


def _same_masks(old: TrieAutomaton, new: TrieAutomaton) -> None:
    assert old.values() == new.values()
    for value in new.values()[:50]:
        text = value.encode() if isinstance(value, str) else value
        a, b = old.initial_state, new.initial_state
        for byte in text:
            assert np.array_equal(old.allowed_token_ids(a), new.allowed_token_ids(b))
            a, b = old.next_state(a, byte), new.next_state(b, byte)
        assert old.is_accepting(a) and new.is_accepting(b)


def test_old_automaton_pickles_and_files_load() -> None:
    vocab = _vocabulary()
    compiler = Compiler(vocab, disk_cache=False)
    fresh = {
        "trie": compiler.compile(["get_user", "get_users", "list", "delete"]),
        "updated": compiler.compile(["get_user", "get_users", "put", "delete"]),
        "lazy": compiler.compile([f"v{i}" for i in range(50)], layout="lazy"),
    }
    for name, new in fresh.items():
        old = pickle.loads((DATA / f"{name}.pickle").read_bytes())
        _same_masks(old, new)
        _same_masks(TrieAutomaton.load(DATA / f"{name}.triemask", vocab=vocab), new)
    assert isinstance(TrieAutomaton.load(DATA / "lazy.triemask", vocab=vocab), LazyTrieAutomaton)
    dag = pickle.loads((DATA / "dag.pickle").read_bytes())
    assert isinstance(dag, DagAutomaton) and dag.pattern == compiler.compile_format("date").pattern
    assert TrieAutomaton.load(DATA / "dag.triemask", vocab=vocab).set_fingerprint == dag.set_fingerprint
    matcher = pickle.loads((DATA / "matcher.pickle").read_bytes())
    assert isinstance(matcher, Matcher) and matcher.accept_tokens(list(b"_user")) == 5 and matcher.value == "get_user"
    assert pickle.loads((DATA / "vocabulary.pickle").read_bytes()) == vocab


def test_old_schema_pickles_and_files_load() -> None:
    pytest.importorskip("xgrammar")
    vocab = _vocabulary()
    texts = {"schema": b'{"label": "L7"}', "tools": b'{"name": "tool_7", "arguments": {"q": "x"}}'}
    for name, text in texts.items():
        pickled = pickle.loads((DATA / f"{name}.pickle").read_bytes())
        for old in (pickled, CompiledSchema.load(DATA / f"{name}.triemask", vocab=vocab)):
            matcher = Matcher(old)
            assert matcher.accept_tokens(list(text)) == len(text), name
            assert matcher.value == json.loads(text)
            assert Matcher(old).accept_tokens(list(b'{"label": "L300"}')) < 17  # not a member
