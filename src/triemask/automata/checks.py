"""Checks of automata files: every stored field checked before anything is built from it."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..base import AutomatonFileError, build_trie, kernels

STORED_DTYPES = {
    "edge_offsets": np.int32,
    "edge_tokens": np.int32,
    "edge_dests": np.int32,
    "terminal_nodes": np.int32,
    "terminal_values": np.int32,
    "value_flat": np.uint8,
    "value_starts": np.int64,
    "level_offsets": np.int64,
    "spell_ids": np.int32,
    "spell_offsets": np.int64,
    "spell_flat": np.uint8,
    "dag_in_offsets": np.int64,
    "dag_source": np.int32,
    "dag_byte": np.uint8,
    "dag_dest": np.int32,
    "dag_accepting": np.int32,
    "dag_level_offsets": np.int64,
}


def expect_dtype(arrays: dict[str, Any], name: str, dtype: Any) -> None:
    array = arrays[name]
    if not isinstance(array, np.ndarray) or array.dtype != dtype or array.ndim != 1:
        raise AutomatonFileError(f"{name} is not a 1-D {np.dtype(dtype)} array", field=name)


def expect_within(array: npt.NDArray[Any], low: int, high: int, name: str) -> None:
    if array.size and (int(array.min()) < low or int(array.max()) >= high):
        raise AutomatonFileError(f"{name} holds values outside [{low}, {high})", field=name)


def check_meta(meta: Any, vocab: Any) -> None:
    """A file's scalar fields, against the vocabulary it is loaded for (when given): the
    logits width and EOS ids are the vocabulary's, never the file's word."""
    if not isinstance(meta, dict):
        raise AutomatonFileError("its fields are not an object", field="meta")
    vocab_size, eos = meta.get("vocab_size"), meta.get("eos_token_ids")
    if type(vocab_size) is not int or not 0 < vocab_size < 1 << 31:
        raise AutomatonFileError(f"vocab_size {vocab_size!r:.40} is not a positive int32", field="vocab_size")
    if not isinstance(eos, list) or not all(type(t) is int and 0 <= t < vocab_size for t in eos):
        raise AutomatonFileError(f"eos_token_ids {eos!r:.60} are not ids of the vocabulary", field="eos_token_ids")
    for name in ("values_are_str", "eos"):
        if type(meta.get(name)) is not bool:
            raise AutomatonFileError(f"{name} is not a boolean", field=name)
    if vocab is not None:
        if vocab_size != vocab.vocab_size:
            raise AutomatonFileError(
                f"vocab_size {vocab_size} is not the vocabulary's ({vocab.vocab_size})", field="vocab_size"
            )
        if tuple(eos) != tuple(vocab.eos_token_ids):
            raise AutomatonFileError(
                f"eos_token_ids {eos} are not the vocabulary's {list(vocab.eos_token_ids)}", field="eos_token_ids"
            )


def _utf8_steps() -> npt.NDArray[np.uint16]:
    """``steps[states, byte]``: the set of UTF-8 decoder states after ``byte`` from a set of
    them (bit i: state i; 0 between characters, 1-3 that many continuation bytes due, 4-7 the
    restricted second bytes after E0, ED, F0, F4 (RFC 3629); bit 8: not UTF-8)."""
    one = np.full((8, 256), 8, dtype=np.int64)
    one[0, :0x80] = 0
    one[0, 0xC2:0xE0], one[0, 0xE1:0xF0], one[0, 0xF1:0xF4] = 1, 2, 3
    one[0, 0xE0], one[0, 0xED], one[0, 0xF0], one[0, 0xF4] = 4, 5, 6, 7
    one[1, 0x80:0xC0], one[2, 0x80:0xC0], one[3, 0x80:0xC0] = 0, 1, 2
    one[4, 0xA0:0xC0], one[5, 0x80:0xA0], one[6, 0x90:0xC0], one[7, 0x80:0x90] = 1, 1, 2, 2
    steps = np.zeros((512, 256), dtype=np.uint16)
    for state in range(8):
        has = (np.arange(512) >> state) & 1 == 1
        steps[has] |= (1 << one[state]).astype(np.uint16)
    return steps


_UTF8_STEPS: npt.NDArray[np.uint16] | None = None


def spells_utf8(
    source: npt.NDArray[Any],
    byte: npt.NDArray[Any],
    dest: npt.NDArray[Any],
    levels: npt.NDArray[Any],
    accepting: npt.NDArray[Any],
) -> bool:
    """Whether every path of a byte DAG (edges grouped by destination, nodes numbered by
    level) from node 0 to an accepting node spells UTF-8: the decoder states reaching each
    node, propagated level by level."""
    steps = utf8_steps()
    reach = np.zeros(int(levels[-1]), dtype=np.uint16)
    if not len(reach):
        return True
    reach[0] = 1
    for low, high in zip(levels[1:-1].tolist(), levels[2:].tolist(), strict=True):  # destinations by level
        lo, hi = np.searchsorted(dest, low), np.searchsorted(dest, high)
        np.bitwise_or.at(reach, dest[lo:hi], steps[reach[source[lo:hi]], byte[lo:hi]])
    return not (reach & 0x100).any() and not (reach[accepting] & 0xFE).any()


def check_edges_spell_values(arrays: dict[str, Any], vocab: Any) -> None:
    """That a trie file's nodes and edges are those of *its* values, so that it allows no token
    its values' language refuses, whatever else the file held (another set's edges under these
    values included): the values' trie is built again (the compiler's construction, so its
    numbering) and compared node for node, and every edge's token is walked back from its
    destination, byte by byte, to its source (in C: 11 ms for 2.3 million edges, with the trie
    built again in 16 ms). Edges a file left out cannot be told without compiling again: they
    narrow masks, never widen them."""
    value_flat, value_starts = arrays["value_flat"], arrays["value_starts"]
    offsets, tokens, dests = arrays["edge_offsets"], arrays["edge_tokens"], arrays["edge_dests"]
    n = len(offsets) - 2
    trie = build_trie(value_flat, value_starts)
    if trie.num_nodes != n or not np.array_equal(trie.level_offsets, arrays["level_offsets"]):
        raise AutomatonFileError("nodes that are not the trie of the values", field="edge_offsets")
    if len(trie.terminal) != len(value_starts) - 1 or not np.array_equal(
        trie.terminal[arrays["terminal_values"]], arrays["terminal_nodes"]
    ):
        raise AutomatonFileError("terminal nodes that are not the values' ends", field="terminal_nodes")
    lengths, token_offsets, data = vocab.byte_table()
    eos = np.asarray(vocab.eos_token_ids, dtype=np.int32)
    native = kernels.KERNELS
    parts = (trie.parent, trie.byte, offsets, tokens, dests, lengths, token_offsets, data, trie.terminal, eos)
    bad = native.spelled_edges(*parts) if native is not None else first_misspelled_edge(*parts)
    if bad >= 0:
        raise AutomatonFileError(f"edge {bad}'s token does not spell the path it takes", field="edge_tokens")


def first_misspelled_edge(
    parent: npt.NDArray[np.int32],
    byte: npt.NDArray[np.uint8],
    offsets: npt.NDArray[np.int32],
    tokens: npt.NDArray[np.int32],
    dests: npt.NDArray[np.int32],
    lengths: npt.NDArray[np.int32],
    token_offsets: npt.NDArray[np.int64],
    data: bytes,
    terminal: npt.NDArray[np.int32],
    eos: npt.NDArray[np.int32],
) -> int:
    """The NumPy reference of the C ``spelled_edges``: the index of the first edge whose token
    does not spell the path from its source to its destination (all walked back together, a
    byte a step), or, to final state ``n + v``, that is not an EOS token from value ``v``'s
    node; else -1."""
    n = len(parent)
    raw = np.frombuffer(data, dtype=np.uint8)
    sources = np.repeat(np.arange(n, dtype=np.int64), np.diff(offsets[: n + 1]))
    bad = np.zeros(len(sources), dtype=bool)
    final = np.flatnonzero(dests[: len(sources)] >= n)
    value = dests[final].astype(np.int64) - n
    known = value < len(terminal)
    bad[final] = ~known | ~np.isin(tokens[final], eos)
    bad[final[known]] |= terminal[value[known]] != sources[final[known]]
    edge = np.flatnonzero(dests[: len(sources)] < n)
    token = tokens[edge].astype(np.int64)
    known = (token >= 0) & (token < len(lengths))
    left = np.where(known, lengths[np.where(known, token, 0)], 0).astype(np.int64)
    bad[edge[left <= 0]] = True
    keep = left > 0
    edge, at, left = edge[keep], dests[edge[keep]].astype(np.int64), left[keep]
    position = token_offsets[token[keep]] + left - 1  # the token's last byte: the edge into `at`
    while len(edge):
        wrong = (at <= 0) | (byte[np.maximum(at, 0)] != raw[position])
        bad[edge[wrong]] = True
        at, position, left = parent[np.maximum(at, 0)].astype(np.int64), position - 1, left - 1
        done = left == 0
        bad[edge[done & ~wrong & (at != sources[edge])]] = True
        more = ~done & ~wrong
        edge, at, position, left = edge[more], at[more], position[more], left[more]
    found = np.flatnonzero(bad)
    return int(found[0]) if len(found) else -1


def utf8_steps() -> npt.NDArray[np.uint16]:
    """The table of :func:`spells_utf8` (built once)."""
    global _UTF8_STEPS
    if _UTF8_STEPS is None:
        _UTF8_STEPS = _utf8_steps()
    return _UTF8_STEPS


def stored_arguments(cls: Any, arrays: dict[str, Any]) -> dict[str, Any]:
    """The constructor's array arguments from a file's arrays (the derived ones if there)."""
    found = {name: arrays[name] for name in cls._ARRAYS}
    found.update({name: arrays[name] for name in cls._DERIVED if name in arrays})
    return found
