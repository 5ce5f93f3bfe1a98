"""Peer equivalence: triemask's masks equal xgrammar's for the union of the values.

Run with `make test-peers` (installs torch 2.13.0 CPU, then xgrammar); not part of
`make test`.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import real_compiler, real_vocabulary
from triemask import TrieAutomaton
from triemask.datasets import load_labels, synthetic_tools

pytestmark = pytest.mark.peers
xgr = pytest.importorskip("xgrammar")


def _ebnf(values: list[str]) -> str:
    """``root ::= "v1" | "v2" | ...`` with JSON string escapes (which xgrammar's EBNF accepts)."""
    return "root ::= " + " | ".join(json.dumps(v, ensure_ascii=False) for v in values)


def _paths(automaton: TrieAutomaton) -> dict[int, list[int]]:
    """A token path from the initial state to every reachable non-final state."""
    eos = set(automaton.eos_token_ids)
    paths: dict[int, list[int]] = {automaton.initial_state: []}
    queue = [automaton.initial_state]
    for state in queue:
        for token in automaton.allowed_token_ids(state).tolist():
            following = automaton.next_state(state, token)
            if token not in eos and following not in paths:
                paths[following] = [*paths[state], token]
                queue.append(following)
    return paths


@pytest.mark.parametrize("vocab_name", ["qwen2", "mistral-spm-32k", "o200k_base"])
@pytest.mark.parametrize("set_name", ["tools", "banking77", "nested"])
def test_masks_equal_xgrammar(vocab_name: str, set_name: str) -> None:
    values = {
        "tools": synthetic_tools(150, seed=5),
        "banking77": load_labels("banking77"),
        "nested": ["g", "get", "get_user", "get_users", "🦙", "🦙🦙", "naïve"],
    }[set_name]
    real = real_vocabulary(vocab_name)
    vocab = real.vocab
    encoded = [vocab.token_bytes(i) or b"" for i in range(len(vocab))]
    info = xgr.TokenizerInfo(
        encoded, xgr.VocabType.RAW, vocab_size=vocab.vocab_size, stop_token_ids=list(vocab.eos_token_ids)
    )
    compiled = xgr.GrammarCompiler(info).compile_grammar(_ebnf(values))
    automaton = real_compiler(vocab_name).compile(values)
    ours = np.zeros((1, (vocab.vocab_size + 31) // 32), dtype=np.int32)
    theirs = xgr.allocate_token_bitmask(1, vocab.vocab_size)
    for state, path in _paths(automaton).items():
        matcher = xgr.GrammarMatcher(compiled)
        for token in path:
            assert matcher.accept_token(token), (vocab_name, set_name, path)
        matcher.fill_next_token_bitmask(theirs)
        automaton.fill_bitmask(ours, [state])
        difference = np.flatnonzero(np.unpackbits((ours[0] ^ theirs[0].numpy()).view(np.uint8), bitorder="little"))
        assert difference.size == 0, (vocab_name, set_name, vocab.decode(path), difference[:10].tolist())
