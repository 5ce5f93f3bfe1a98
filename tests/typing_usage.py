"""Checked by mypy (`make typecheck`), never run: the helpers triemask imports on first use
(they need torch and transformers) have their real types, not `object`."""

from collections.abc import Callable

import triemask
from triemask.automata import Automaton

choose: Callable[..., object] = triemask.choose
generate_json: Callable[..., object] = triemask.generate_json
load_default_model: Callable[..., object] = triemask.load_default_model


def every_kind_is_an_automaton(
    trie: triemask.TrieAutomaton,
    dag: triemask.DagAutomaton,
    lazy: triemask.LazyTrieAutomaton,
    updated: triemask.UpdatedTrieAutomaton,
) -> list[Automaton]:
    """Each kind conforms to the declared interface (mypy checks the members' signatures)."""
    return [trie, dag, lazy, updated]
