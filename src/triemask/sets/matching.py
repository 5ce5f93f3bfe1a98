"""Matching a value trie or byte DAG against the vocabulary's tokens: the edges of an automaton."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..base import ByteDag, ByteTrie, IncompatibleValueError, ValueSetError, mix64
from ..vocab import TokenIndex
from .budget import EdgeBudget

# --------------------------------------------------------------------------- matching


class EdgeKeys:
    """Packs an edge ``(source, token, destination)`` into one uint64 whose order is
    (source, token): sorting the keys groups edges by node, tokens ascending.

    When the three do not fit 64 bits (about 2^23 states with a 262K vocabulary), a key is
    two uint64 columns instead, ``(source, token)`` and the destination: twice the memory
    and an argsort instead of a sort, so there is no limit on the number of nodes.
    """

    def __init__(self, num_nodes: int, num_states: int, vocab_size: int) -> None:
        self.token_bits = max(int(vocab_size - 1).bit_length(), 1)
        self.dest_bits = max(int(num_states - 1).bit_length(), 1)
        self.wide = int(num_nodes).bit_length() + self.token_bits + self.dest_bits > 64
        shift = self.token_bits if self.wide else self.token_bits + self.dest_bits
        self.source_shift = np.uint64(shift)
        self.token_shift = np.uint64(0 if self.wide else self.dest_bits)

    def pack(
        self, sources: npt.NDArray[Any], tokens: npt.NDArray[Any], dests: npt.NDArray[np.uint64]
    ) -> npt.NDArray[np.uint64]:
        keys: npt.NDArray[np.uint64] = (sources.astype(np.uint64) << self.source_shift) | (
            tokens.astype(np.uint64) << self.token_shift
        )
        if self.wide:
            return np.stack([keys, dests.astype(np.uint64, copy=False)], axis=1)
        return keys | dests.astype(np.uint64, copy=False)

    def csr(
        self, batches: list[npt.NDArray[np.uint64]], num_nodes: int
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """Sort the keys and split them into CSR arrays (tokens, destinations, offsets)."""
        empty = np.zeros((0, 2) if self.wide else 0, dtype=np.uint64)
        keys = np.concatenate(batches) if batches else empty
        if self.wide:  # (source, token) are distinct: their order is the edges' order
            keys = keys[np.argsort(keys[:, 0])]
            dests = keys[:, 1].astype(np.int32)
            keys = keys[:, 0]
        else:
            keys.sort()
            dests = (keys & np.uint64((1 << self.dest_bits) - 1)).astype(np.int32)
        sources = keys >> self.source_shift
        tokens = ((keys >> self.token_shift) & np.uint64((1 << self.token_bits) - 1)).astype(np.int32)
        offsets = np.zeros(num_nodes + 2, dtype=np.int64)  # counting is 3x faster than searchsorted here
        np.cumsum(np.bincount(sources.astype(np.intp), minlength=num_nodes + 1), out=offsets[1:])
        if len(keys) >= 1 << 31:  # pragma: no cover - over 2**31 edges
            raise ValueSetError(f"{len(keys)} edges exceed triemask's 32-bit offsets; split the set")
        return tokens, dests, offsets.astype(np.int32)


def match_trie(trie: ByteTrie, index: TokenIndex, keys: EdgeKeys) -> list[npt.NDArray[np.uint64]]:
    """All allowed text edges, as packed keys, in batches."""
    parent, byte = trie.parent, trie.byte
    n = trie.num_nodes
    ends = np.arange(1, n, dtype=np.uint64)  # m
    starts = parent[1:]  # a, the start of the path a -> m
    suffix = index.step(np.zeros(n - 1, dtype=np.int32), byte[1:], 0)  # u, that path reversed
    found: list[npt.NDArray[np.uint64]] = []
    level = 1
    while suffix.size:
        token = index.first_token[suffix]
        whole = token >= 0
        found.append(keys.pack(starts, token, ends)[whole])
        if index.dup_tokens is not None:
            found.extend(_duplicate_edges(index, keys, starts[whole], suffix[whole], ends[whole]))
        grow = index.has_children[suffix]
        grow &= starts != 0
        starts, ends, suffix = starts[grow], ends[grow], suffix[grow]
        suffix = index.step(suffix, byte[starts], level)
        starts = parent[starts]
        level += 1
    return found


def match_dag(
    dag: ByteDag, index: TokenIndex, keys: EdgeKeys, budget: EdgeBudget | None = None
) -> list[npt.NDArray[np.uint64]]:
    """``match_trie`` over an acyclic automaton: a node may have several incoming edges,
    so each step up the automaton fans a frontier entry out over the edges into its
    start. Determinism keeps the triples (start, end, token suffix) distinct: from a
    start node, a byte string leads to one end node at most."""
    in_offsets, in_degree = dag.in_offsets, np.diff(dag.in_offsets)
    starts = dag.source.astype(np.int64)  # a
    ends = dag.dest.astype(np.uint64)  # m
    suffix = index.step(np.zeros(dag.num_edges, dtype=np.int32), dag.byte, 0)  # u, the path a -> m reversed
    found: list[npt.NDArray[np.uint64]] = []
    level = 1
    while suffix.size:
        token = index.first_token[suffix]
        whole = token >= 0
        batch = [keys.pack(starts[whole], token[whole], ends[whole])]
        if index.dup_tokens is not None:
            batch += _duplicate_edges(index, keys, starts[whole], suffix[whole], ends[whole])
        found += batch
        grow = index.has_children[suffix]
        grow &= in_degree[starts] > 0
        starts, ends, suffix = starts[grow], ends[grow], suffix[grow]
        counts = in_degree[starts]
        total = int(counts.sum())
        if budget is not None:  # (every edge of the level, duplicate ids included)
            budget.spend(sum(map(len, batch)), total)
        entry = np.repeat(np.arange(len(starts)), counts)
        edge = np.arange(total) + np.repeat(in_offsets[starts] - (np.cumsum(counts) - counts), counts)
        suffix = index.step(suffix[entry], dag.byte[edge], level)
        starts, ends = dag.source[edge].astype(np.int64), ends[entry]
        level += 1
    return found


def _byte_classes(dag: ByteDag) -> tuple[npt.NDArray[np.int64], int] | None:
    """Bytes that label exactly the same (source, destination) pairs are interchangeable:
    a class id per byte (-1 for bytes on no edge) and the number of classes, or None when
    classes would not merge at least half of the bytes (then byte matching is as cheap)."""
    order = np.lexsort((dag.dest, dag.source, dag.byte))
    byte = dag.byte[order]
    pair = (dag.source[order].astype(np.uint64) << np.uint64(32)) | dag.dest[order].astype(np.uint64)
    count = np.bincount(byte, minlength=256)
    used = np.flatnonzero(count)
    start = np.concatenate(([0], np.cumsum(count)))
    with np.errstate(over="ignore"):
        signature = np.zeros(256, dtype=np.uint64)
        np.add.at(signature, byte, mix64(pair))
        signature += count.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    _, first, inverse = np.unique(signature[used], return_index=True, return_inverse=True)
    if 2 * len(first) > len(used):
        return None
    # exact check: each byte's sorted pairs equal its class representative's
    representative = used[first][inverse]
    rank = np.arange(len(byte)) - start[byte]
    if not np.array_equal(pair, pair[start[representative[np.searchsorted(used, byte)]] + rank]):
        return None  # a hash collision: match byte by byte
    classes = np.full(256, -1, dtype=np.int64)
    classes[used] = inverse.reshape(-1)
    return classes, len(first)


def match_dag_by_class(
    dag: ByteDag, index: TokenIndex, keys: EdgeKeys, budget: EdgeBudget | None = None
) -> list[npt.NDArray[np.uint64]] | None:
    """``match_dag`` over byte *classes*, for automata whose edges carry many
    interchangeable bytes (``[0-9A-Fa-f]``): tokens whose bytes have the same classes
    are allowed in the same places, so the matching runs once per class string.

    1. The token suffixes made of bytes the automaton uses are enumerated in the token
       index (children are contiguous), and each is mapped to its class string, building
       the (reversed) trie of class strings and the tokens that end at each of its nodes.
    2. The backward matching of ``match_dag`` runs on the automaton with class labels
       against that small trie.
    3. Each edge ``a --class string--> m`` becomes an edge for every token of the string.

    Returns None when the classes do not merge enough bytes to pay.
    """
    found_classes = _byte_classes(dag)
    if found_classes is None:
        return None
    classes, k = found_classes
    # the class-labelled automaton: one edge per (source, class, destination), sorted by
    # destination (determinism then keeps the matching's triples distinct)
    n = dag.num_nodes
    labelled = np.unique((dag.dest.astype(np.int64) * n + dag.source) * k + classes[dag.byte])
    dag_class = labelled % k
    edge_source = (labelled // k) % n
    edge_dest = labelled // (k * n)
    in_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(edge_dest, minlength=n), out=in_offsets[1:])
    # class b may come right before class c only if some node has an edge of b in and of c out
    out_offsets = np.zeros(n + 1, dtype=np.int64)
    by_source = np.argsort(edge_source, kind="stable")
    np.cumsum(np.bincount(edge_source, minlength=n), out=out_offsets[1:])
    outs = np.diff(out_offsets)
    pairs_in = np.repeat(np.arange(len(labelled)), outs[edge_dest])
    pairs_out = by_source[
        np.arange(len(pairs_in))
        + np.repeat(out_offsets[edge_dest] - (np.cumsum(outs[edge_dest]) - outs[edge_dest]), outs[edge_dest])
    ]
    follows = np.zeros(k * k, dtype=bool)
    follows[dag_class[pairs_in] * k + dag_class[pairs_out]] = True
    # 1. the (reversed) trie of the class strings of token suffixes made of used bytes,
    # level by level, only as long as the automaton's longest path and along class pairs
    # that can follow each other
    u = np.zeros(1, dtype=np.int64)  # token index nodes
    c = np.zeros(1, dtype=np.int64)  # class trie nodes
    last = np.full(1, -1, dtype=np.int64)  # the class that starts the suffix so far (-1: none)
    nodes = 1
    table_keys, table_children, visited_u, visited_c = [], [], [], []
    for _ in range(len(dag.level_offsets) - 2):
        counts = index.child_offsets[u + 1] - index.child_offsets[u]
        child = np.arange(int(counts.sum())) + np.repeat(index.child_offsets[u] - (np.cumsum(counts) - counts), counts)
        parent_c, parent_last = np.repeat(c, counts), np.repeat(last, counts)
        label = classes[index.node_byte[child]]
        pair = np.maximum(label, 0) * k + np.maximum(parent_last, 0)
        keep = (label >= 0) & ((parent_last < 0) | follows[pair])
        child, parent_c, label = child[keep], parent_c[keep], label[keep]
        if not child.size:
            break
        step_keys, inverse = np.unique(parent_c * k + label, return_inverse=True)
        table_keys.append(step_keys)
        table_children.append(np.arange(nodes, nodes + len(step_keys)))
        u, c, last = child, nodes + inverse.reshape(-1), label
        nodes += len(step_keys)
        visited_u.append(u)
        visited_c.append(c)
    if not visited_u:
        return []
    all_u, all_c = np.concatenate(visited_u), np.concatenate(visited_c)
    step = np.full(nodes * k + 1, nodes, dtype=np.int64)  # sentinel `nodes`: no such class string
    step[np.concatenate(table_keys)] = np.concatenate(table_children)
    has_children = np.zeros(nodes + 1, dtype=bool)
    has_children[np.concatenate(table_keys) // k] = True
    # tokens ending at each class trie node (first ids and duplicates)
    token = index.first_token[all_u]
    whole = token >= 0
    groups_c, groups_t = [all_c[whole]], [token[whole]]
    if index.dup_tokens is not None and index.dup_offsets is not None:
        lo = index.dup_offsets[all_u]
        dup_counts = index.dup_offsets[all_u + 1] - lo
        total = int(dup_counts.sum())
        if total:
            at = np.arange(total) + np.repeat(lo - (np.cumsum(dup_counts) - dup_counts), dup_counts)
            groups_c.append(np.repeat(all_c, dup_counts))
            groups_t.append(index.dup_tokens[at])
    group_c, group_t = np.concatenate(groups_c), np.concatenate(groups_t)
    order = np.argsort(group_c, kind="stable")
    group_t = group_t[order]
    group_offsets = np.zeros(nodes + 2, dtype=np.int64)
    np.cumsum(np.bincount(group_c, minlength=nodes + 1), out=group_offsets[1:])
    # 2. backward matching on the class-labelled automaton
    in_degree = np.diff(in_offsets)
    starts, ends = edge_source, edge_dest
    suffix = step[dag_class]  # from the class trie's root (node 0)
    hits_a, hits_c, hits_m = [], [], []
    while suffix.size:
        has_tokens = group_offsets[suffix + 1] > group_offsets[suffix]
        hits_a.append(starts[has_tokens])
        hits_c.append(suffix[has_tokens])
        hits_m.append(ends[has_tokens])
        grow = has_children[suffix] & (in_degree[starts] > 0)
        starts, ends, suffix = starts[grow], ends[grow], suffix[grow]
        counts = in_degree[starts]
        if budget is not None:  # each class string is one token at least: a lower bound of the edges
            budget.spend(len(hits_a[-1]), int(counts.sum()))
        entry = np.repeat(np.arange(len(starts)), counts)
        edge = np.arange(int(counts.sum())) + np.repeat(in_offsets[starts] - (np.cumsum(counts) - counts), counts)
        suffix = step[suffix[entry] * k + dag_class[edge]]
        starts, ends = edge_source[edge], ends[entry]
    # 3. one edge per token of each matched class string
    a, cs, m = np.concatenate(hits_a), np.concatenate(hits_c), np.concatenate(hits_m)
    sizes = group_offsets[cs + 1] - group_offsets[cs]
    if budget is not None:
        budget.check_total(int(sizes.sum()))
    at = np.arange(int(sizes.sum())) + np.repeat(group_offsets[cs] - (np.cumsum(sizes) - sizes), sizes)
    return [keys.pack(np.repeat(a, sizes), group_t[at], np.repeat(m, sizes).astype(np.uint64))]


def _duplicate_edges(
    index: TokenIndex, keys: EdgeKeys, a: npt.NDArray[Any], u: npt.NDArray[Any], m: npt.NDArray[np.uint64]
) -> list[npt.NDArray[np.uint64]]:
    """Edges for the other ids of tokens whose bytes equal another token's."""
    assert index.dup_offsets is not None and index.dup_tokens is not None
    lo = index.dup_offsets[u]
    counts = index.dup_offsets[u + 1] - lo
    total = int(counts.sum())
    if not total:
        return []
    which = np.repeat(np.arange(len(u)), counts)
    position = np.arange(total) + np.repeat(lo - (np.cumsum(counts) - counts), counts)
    return [keys.pack(a[which], index.dup_tokens[position], m[which])]


def eos_edges(
    terminal: npt.NDArray[np.int32], num_nodes: int, keys: EdgeKeys, eos_ids: tuple[int, ...]
) -> npt.NDArray[np.uint64]:
    """``terminal[i] --eos--> final state num_nodes + i`` for every EOS id."""
    k = len(terminal)
    sources = np.repeat(terminal, len(eos_ids))
    tokens = np.tile(np.asarray(eos_ids, dtype=np.int64), k)
    finals = np.repeat(np.arange(num_nodes, num_nodes + k, dtype=np.uint64), len(eos_ids))
    return keys.pack(sources, tokens, finals)


# --------------------------------------------------------------------------- rare path


def prune_unreachable(
    n: int,
    levels: npt.NDArray[np.int64],
    terminal: npt.NDArray[np.int32],
    tokens: npt.NDArray[np.int32],
    dests: npt.NDArray[np.int32],
    offsets: npt.NDArray[np.int32],
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.bool_]]:
    """For vocabularies lacking some single-byte token: drop edges into nodes from
    which no token sequence completes a value (the masks never lead into a dead
    end). Also returns which states the remaining edges reach from the start.

    Nodes are numbered by level and every edge leads to a deeper level (a trie's
    depth, a DAG's longest distance from the start), so one sweep each way settles it.
    """
    live = np.zeros(n + len(terminal), dtype=bool)  # one final state per terminal
    live[terminal] = True
    live[n:] = True  # final states
    for depth in range(len(levels) - 2, -1, -1):  # edges lead deeper: settle the deep levels first
        lo, hi = int(levels[depth]), int(levels[depth + 1])
        e_lo, e_hi = int(offsets[lo]), int(offsets[hi])
        if e_hi > e_lo:
            reached = np.concatenate(([0], np.cumsum(live[dests[e_lo:e_hi]])))
            live[lo:hi] |= reached[offsets[lo + 1 : hi + 1] - e_lo] > reached[offsets[lo:hi] - e_lo]
    keep = live[dests]
    kept_before = np.concatenate(([0], np.cumsum(keep)))
    tokens, dests, offsets = tokens[keep], dests[keep], kept_before[offsets].astype(np.int32)
    reachable = np.zeros(len(live), dtype=bool)
    reachable[0] = True
    for depth in range(len(levels) - 1):
        lo, hi = int(levels[depth]), int(levels[depth + 1])
        from_reached = np.repeat(reachable[lo:hi], np.diff(offsets[lo : hi + 1]))
        reachable[dests[int(offsets[lo]) : int(offsets[hi])][from_reached]] = True
    return tokens, dests, offsets, reachable


def raise_incompatible(
    trie: ByteTrie, index: TokenIndex, reachable: npt.NDArray[np.bool_], value_index: int, are_str: bool
) -> None:
    raw = trie.string(value_index)
    value: str | bytes = raw.decode("utf-8") if are_str else raw
    for offset, b in enumerate(raw):
        if not index.byte_in_token[b]:
            raise IncompatibleValueError(
                f"value {value!r} cannot be spelled with this vocabulary's text tokens: byte 0x{b:02x} "
                f"at offset {offset} occurs in no text token",
                value=value,
                offset=offset,
            )
    path = [int(trie.terminal[value_index])]
    while path[-1] != 0:
        path.append(int(trie.parent[path[-1]]))
    spellable = max(depth for depth, node in enumerate(reversed(path)) if reachable[node])
    raise IncompatibleValueError(
        f"value {value!r} cannot be spelled with this vocabulary's text tokens: the longest prefix "
        f"a token sequence can produce is {raw[:spellable]!r} (offset {spellable}), and no token "
        "sequence continues from there to the end of the value",
        value=value,
        offset=spellable,
    )
