"""The lazy layout's arrays, built from a value trie or a pattern's byte DAG."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..automata import LAZY_BLOCK, LAZY_DEAD, LAZY_TERMINAL
from ..base import ByteDag, ByteTrie, kernels


def _node_arrays(
    counts: npt.NDArray[np.int64], terminal: npt.NDArray[Any], live: npt.NDArray[np.bool_] | None
) -> dict[str, npt.NDArray[Any]]:
    """Each node's word (its number of children, whether a value ends there, whether no token
    sequence completes one from there: ``live`` False; None: all live) and the samples every
    64th node: the first child (slot), numbered from 1, and the terminals before it."""
    n = len(counts)
    is_terminal = np.zeros(n, dtype=bool)
    is_terminal[terminal] = True
    words = counts.astype(np.uint16) | np.where(is_terminal, np.uint16(LAZY_TERMINAL), np.uint16(0))
    if live is not None:
        words |= np.where(live[:n], np.uint16(0), np.uint16(LAZY_DEAD))
    starts = np.arange(0, n, LAZY_BLOCK)
    child_blocks = np.ones(len(starts) + 1, dtype=np.int32)
    np.cumsum(np.add.reduceat(counts, starts), out=child_blocks[1:])
    child_blocks[1:] += 1
    terminal_blocks = np.zeros(len(starts) + 1, dtype=np.int32)
    np.cumsum(np.add.reduceat(is_terminal.view(np.uint8), starts, dtype=np.int64), out=terminal_blocks[1:])
    return {"node_word": words, "child_blocks": child_blocks, "terminal_blocks": terminal_blocks}


def lazy_arrays(trie: ByteTrie, live: npt.NDArray[np.bool_] | None) -> dict[str, npt.NDArray[Any]]:
    """The lazy layout's arrays of a trie; ``live`` marks the nodes from which a token
    sequence completes a value (None: all, as when every byte is a token)."""
    return {
        "node_byte": trie.byte,
        **_node_arrays(np.bincount(trie.parent[1:], minlength=trie.num_nodes), trie.terminal, live),
        # terminal nodes ascending -> the sorted index of their value, and back
        "terminal_values": np.argsort(trie.terminal, kind="stable").astype(np.int32),
        "value_nodes": trie.terminal,
    }


def lazy_dag_arrays(dag: ByteDag, live: npt.NDArray[np.bool_] | None) -> dict[str, npt.NDArray[Any]]:
    """The lazy layout's arrays of a byte DAG: a node's out-edges, by byte, are its "slots"
    where a trie's children would be (numbered from 1), ``node_byte`` their bytes and
    ``slot_dest`` the nodes they lead to; a terminal's value is its rank among the accepting
    nodes (the final state ``num_nodes + rank``, as in :class:`~triemask.DagAutomaton`)."""
    native = kernels.KERNELS
    if native is not None:  # the same arrays (this is the reference), without ten NumPy calls
        built = native.lazy_dag_layout(dag.source, dag.byte, dag.dest, dag.accepting, dag.num_nodes)
        node_byte, slot_dest, words, child_blocks, terminal_blocks = (
            np.frombuffer(buffer, dtype=dtype)
            for buffer, dtype in zip(built, (np.uint8, np.int32, np.uint16, np.int32, np.int32), strict=True)
        )
        if live is not None:
            words |= np.where(live[: dag.num_nodes], np.uint16(0), np.uint16(LAZY_DEAD))
        node = {"node_word": words, "child_blocks": child_blocks, "terminal_blocks": terminal_blocks}
    else:
        order = np.lexsort((dag.byte, dag.source))  # by source, then byte
        node_byte = np.concatenate(([0], dag.byte[order])).astype(np.uint8)
        slot_dest = np.concatenate(([0], dag.dest[order])).astype(np.int32)
        node = _node_arrays(np.bincount(dag.source, minlength=dag.num_nodes), dag.accepting, live)
    return {
        "node_byte": node_byte,
        "slot_dest": slot_dest,
        **node,
        "terminal_values": np.arange(len(dag.accepting), dtype=np.int32),
        "value_nodes": dag.accepting.astype(np.int32),
    }
