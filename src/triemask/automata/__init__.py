"""The compiled, immutable automata (trie, DAG, lazy, updated) and the interface they share:
lookups, fills, stats, files. Imports ``base`` and ``vocab``."""

from .core import DEAD, AutomatonMeta
from .dag import DagAutomaton, DagLanguage
from .forced import whole_characters
from .lazy import DEFAULT_CACHE_BYTES, LAZY_BLOCK, LAZY_DEAD, LAZY_TERMINAL, LazyTrieAutomaton
from .lazy_dag import LazyDagAutomaton
from .protocol import Automaton
from .trie import TrieAutomaton, automaton_from_bytes, native_kernel, restore_parts, restore_stored
from .updated import CutEdges, UpdatedTrieAutomaton

__all__ = [
    "DEAD",
    "DEFAULT_CACHE_BYTES",
    "LAZY_BLOCK",
    "LAZY_DEAD",
    "LAZY_TERMINAL",
    "Automaton",
    "AutomatonMeta",
    "CutEdges",
    "DagAutomaton",
    "DagLanguage",
    "LazyDagAutomaton",
    "LazyTrieAutomaton",
    "TrieAutomaton",
    "UpdatedTrieAutomaton",
    "automaton_from_bytes",
    "native_kernel",
    "restore_parts",
    "restore_stored",
    "whole_characters",
]
