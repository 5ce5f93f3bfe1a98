"""Enum fields: a trie per field and the tables that connect it to the structure; their files."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np
import numpy.typing as npt

from ..automata import TrieAutomaton, restore_parts
from ..base import (
    ArgumentTypeError,
    AutomatonFileError,
    IncompatibleValueError,
    SchemaError,
    integer,
    sorted_unique,
    storage,
)
from ..sets import SetCompiler, unanchored
from ..vocab import Vocabulary
from .reading import all_strings, json_texts
from .structure import DEFAULT_MIN_ENUM_VALUES, DEFAULT_MIN_UNION_BRANCHES, SENTINEL_LEADS
from .support import Pieces, VocabularySupport


@dataclass(frozen=True)
class Field:
    """One trie of a mixed schema and the tables that connect it to the structure."""

    paths: tuple[str, ...]
    placeholders: tuple[str, ...]  # by path: the const standing for the field in the structure's EBNF
    automaton: TrieAutomaton
    sentinel: bytes
    first: bytes
    last: bytes
    pieces: Pieces
    accepting: npt.NDArray[np.bool_]  # by node
    leaves: npt.NDArray[np.bool_]  # accepting nodes nothing extends: the value is over
    tails: dict[bytes, int]  # piece after a value start -> trie node it reaches from the root
    middles: dict[bytes, int]  # a whole value's text piece -> its accepting node
    crossing: frozenset[int]  # tokens that can enter a value of the field (a tail or a middle walks the trie)
    enter_masks: dict[int, tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]]  # prefix id -> words, bits
    middle_by_prefix: dict[int, list[tuple[int, int, int, int]]]  # prefix id -> (token, start, end, node)
    # (node, head piece, accepting node): from `node`, the head piece ends a value; sorted by node
    exit_nodes: npt.NDArray[np.int32]
    exit_pieces: npt.NDArray[np.int32]
    exit_values: npt.NDArray[np.int32]
    compile_seconds: float

    @property
    def exit_nodes_view(self) -> memoryview:
        return self.exit_nodes.data


def compile_field(
    compiler: SetCompiler,
    support: VocabularySupport,
    site_paths: tuple[str, ...],
    values: tuple[Any, ...],
    pattern: str | None = None,
) -> Field:
    started = time.perf_counter()
    path = site_paths[0]
    automaton: TrieAutomaton
    if pattern is not None:  # a finite string field: the pattern's automaton, in quotes
        texts: list[bytes] = []
        first = last = b'"'
        pieces = support.pieces(first, last)
        try:
            automaton, (piece_ids, dests, offsets) = compiler.compile_pattern_matching(
                '"(?:' + unanchored(pattern) + ')"', pieces.index
            )
        except IncompatibleValueError as exc:
            raise SchemaError(f"{path}: {exc}", path=path) from None
    else:
        texts = json_texts(values, path)
        if all_strings(values):  # (most fields: every text is in quotes)
            first = last = b'"'
        else:
            first, last = bytes(sorted({t[0] for t in texts})), bytes(sorted({t[-1] for t in texts}))
        pieces = support.pieces(first, last)
        try:
            automaton, (piece_ids, dests, offsets) = compiler.compile_matching(texts, pieces.index)
        except IncompatibleValueError as exc:
            index = texts.index(exc.value) if isinstance(exc.value, bytes) and exc.value in texts else 0
            raise SchemaError(
                f"{path}[{index}] {values[index]!r:.60} cannot be spelled with this vocabulary's tokens: {exc}",
                path=f"{path}[{index}]",
            ) from None
    accepting_nodes = automaton.accepting_nodes
    n = automaton.num_nodes
    accepting = np.zeros(n + 1, dtype=bool)
    accepting[accepting_nodes] = True
    # a value is a leaf unless another value extends it (sorted: then the next one does; a
    # string's text, or a pattern's, ends with its closing quote, which nothing extends)
    leaves = accepting.copy()
    if first != b'"' and any(b.startswith(a) for a, b in pairwise(sorted(texts))):
        for node in accepting_nodes.tolist():
            if automaton.allowed_token_ids(node).size:
                leaves[node] = False
    # the entries whose piece the trie reaches from its root (one array lookup for them all):
    # a tail enters the value (its piece ends with the token), a middle holds a whole value
    # and goes on (its piece ends at an accepting node before the token's end)
    node_of_piece = np.full(len(pieces.pieces) + 1, -1, dtype=np.int64)
    node_of_piece[piece_ids[offsets[0] : offsets[1]]] = dests[offsets[0] : offsets[1]]
    table = pieces.enters
    reached = node_of_piece[table[:, 0]]
    rows, nodes = table[reached >= 0], reached[reached >= 0]
    tail = rows[:, 5] == 1
    middle = ~tail & accepting[nodes]
    rows, nodes, tail = rows[tail | middle], nodes[tail | middle], tail[tail | middle]
    assert (rows[:, 4] >= 0).all()  # (a value starts only after a structural prefix)
    piece_of = pieces.pieces
    tails = {piece_of[p]: node for p, node in zip(rows[tail, 0].tolist(), nodes[tail].tolist(), strict=True)}
    middles = {piece_of[p]: node for p, node in zip(rows[~tail, 0].tolist(), nodes[~tail].tolist(), strict=True)}
    middle_by_prefix: dict[int, list[tuple[int, int, int, int]]] = {}
    for (_, token, start, end, prefix, _), node in zip(rows[~tail].tolist(), nodes[~tail].tolist(), strict=True):
        middle_by_prefix.setdefault(prefix, []).append((token, start, end, node))
    # per prefix, the words and bits of its entering tokens: every (prefix, token) at once
    pairs = sorted_unique((rows[tail, 4] << 32) | rows[tail, 1])
    keys = (pairs >> 32 << 32) | ((pairs & 0xFFFFFFFF) >> 5)  # (prefix, word)
    firsts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else np.zeros(0, dtype=np.int64)
    bits = np.left_shift(np.uint32(1), (pairs & 31).astype(np.uint32))
    word_bits = np.bitwise_or.reduceat(bits, firsts) if len(firsts) else bits
    prefix_of, word_of = keys[firsts] >> 32, keys[firsts] & 0xFFFFFFFF
    bounds = np.flatnonzero(np.r_[True, prefix_of[1:] != prefix_of[:-1], True])
    enter_masks = {
        int(prefix_of[a]): (word_of[a:b], word_bits[a:b].view(np.int32))
        for a, b in pairwise(bounds.tolist() if len(prefix_of) else [])
    }
    # heads that end a value, from any node
    sources = np.repeat(np.arange(n, dtype=np.int32), np.diff(offsets[: n + 1]))
    ends_value = accepting[dests[: len(sources)]]
    has_heads = np.diff(pieces.head_offsets)[piece_ids[: len(sources)]] > 0
    keep = ends_value & has_heads
    return Field(
        paths=site_paths,
        placeholders=(),  # set by the schema, which numbers the fields
        automaton=automaton,
        sentinel=b"",
        first=first,
        last=last,
        accepting=accepting,
        leaves=leaves,
        pieces=pieces,
        tails=tails,
        middles=middles,
        crossing=frozenset(rows[:, 1].tolist()),
        enter_masks=enter_masks,
        middle_by_prefix=middle_by_prefix,
        exit_nodes=sources[keep],
        exit_pieces=piece_ids[: len(sources)][keep].astype(np.int32),
        exit_values=dests[: len(sources)][keep].astype(np.int32),
        compile_seconds=time.perf_counter() - started,
    )


# A field node's flags for the C step (csrc/schema_step.c's FIELD_*, the same values).
FIELD_LEAF, FIELD_ACCEPTING, FIELD_EXITS = 1, 2, 4


def step_flags(field: Field) -> npt.NDArray[np.uint8]:
    """By trie node: whether a value is over there (leaf), may end there (accepting), and may
    end inside a token from there (exits): where the C step leaves the value to the reference."""
    n = field.automaton.num_nodes
    flags = np.zeros(n, dtype=np.uint8)
    flags[field.leaves[:n]] |= FIELD_LEAF
    flags[field.accepting[:n]] |= FIELD_ACCEPTING
    flags[field.exit_nodes] |= FIELD_EXITS
    return flags


_NO_WORDS, _NO_BITS = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32)


def entry_tables(
    fields: tuple[Field, ...], fields_by_prefix: dict[int, list[int]], prefixes: list[bytes]
) -> tuple[tuple[tuple[Any, ...], ...], ...]:
    """What the C fill reads where a field may be entered (``StepTables``' entries, checked
    there): by structural prefix id, for each field that may follow it, the field, the prefix
    and the field's sentinel, the words and bits of its entering tokens there, and whether a
    token holds a whole value there and goes on (engine._fill_entries)."""

    def entry(k: int, p: int) -> tuple[Any, ...]:
        words, bits = fields[k].enter_masks.get(p, (_NO_WORDS, _NO_BITS))
        return (
            k,
            prefixes[p] + fields[k].sentinel,
            np.ascontiguousarray(words, dtype=np.int64),
            np.ascontiguousarray(bits, dtype=np.int32),
            bool(fields[k].middle_by_prefix.get(p)),
        )

    return tuple(tuple(entry(k, p) for k in fields_by_prefix.get(p, ())) for p in range(len(prefixes)))


def exit_tables(field: Field) -> tuple[Any, ...]:
    """What the C steps read where a value may begin or end inside a token (``StepTables``'
    exits, checked there): the exits by node, their pieces' heads (tokens, ends, the three
    lookups of :class:`~.support.Pieces`), the field's first bytes, its sentinel, its tails
    and middles (read, not copied: the field's own dicts) and its last bytes."""
    pieces = field.pieces
    return (
        np.ascontiguousarray(field.exit_nodes, dtype=np.int32),
        np.ascontiguousarray(field.exit_pieces, dtype=np.int32),
        np.ascontiguousarray(pieces.head_offsets, dtype=np.int64),
        np.ascontiguousarray(pieces.head_tokens, dtype=np.int64),
        np.ascontiguousarray(pieces.head_ends, dtype=np.int32),
        np.ascontiguousarray(pieces.head_lookups, dtype=np.int64),
        field.first,
        field.sentinel,
        field.tails,
        field.middles,
        field.last,
    )


def text_array(text: str) -> npt.NDArray[np.uint8]:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


def array_text(array: npt.NDArray[Any]) -> str:
    if array.dtype != np.uint8:
        raise TypeError(f"text stored as {array.dtype}, not bytes")
    return array.tobytes().decode("utf-8")


def _packed(items: Iterable[bytes]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    items = list(items)
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum([len(item) for item in items], out=offsets[1:])
    return np.frombuffer(b"".join(items), dtype=np.uint8), offsets


def _unpacked(flat: npt.NDArray[Any], offsets: npt.NDArray[Any]) -> list[bytes]:
    if flat.dtype != np.uint8 or offsets.dtype != np.int64 or len(offsets) < 1 or offsets[0] != 0:
        raise ValueError("packed byte strings of the wrong form")
    if (np.diff(offsets) < 0).any() or offsets[-1] != len(flat):
        raise ValueError("packed byte strings out of order or out of bounds")
    data = flat.tobytes()
    bounds = offsets.tolist()
    return [data[a:b] for a, b in pairwise(bounds)]


def field_tables(f: Field) -> dict[str, npt.NDArray[Any]]:
    """The boundary tables of a field as flat arrays (for the file format)."""
    tails, tail_offsets = _packed(f.tails)
    middles, middle_offsets = _packed(f.middles)
    prefixes = sorted(f.enter_masks)
    enter_offsets = np.zeros(len(prefixes) + 1, dtype=np.int64)
    np.cumsum([len(f.enter_masks[p][0]) for p in prefixes], out=enter_offsets[1:])
    middle_entries = [(p, *entry) for p, entries in sorted(f.middle_by_prefix.items()) for entry in entries]
    return {
        "accepting": f.accepting,
        "leaves": f.leaves,
        "tails": tails,
        "tail_offsets": tail_offsets,
        "tail_nodes": np.fromiter(f.tails.values(), dtype=np.int32, count=len(f.tails)),
        "middles": middles,
        "middle_offsets": middle_offsets,
        "middle_nodes": np.fromiter(f.middles.values(), dtype=np.int32, count=len(f.middles)),
        "crossing": np.array(sorted(f.crossing), dtype=np.int32),
        "enter_prefixes": np.array(prefixes, dtype=np.int32),
        "enter_offsets": enter_offsets,
        "enter_words": np.concatenate([f.enter_masks[p][0] for p in prefixes] or [np.zeros(0, np.int64)]),
        "enter_bits": np.concatenate([f.enter_masks[p][1] for p in prefixes] or [np.zeros(0, np.int32)]),
        "middle_entries": np.array(middle_entries, dtype=np.int32).reshape(-1),
        "exit_nodes": f.exit_nodes,
        "exit_pieces": f.exit_pieces,
        "exit_values": f.exit_values,
    }


def stored_field_automaton(stored: storage.Stored, k: int, vocab: Vocabulary | None = None) -> TrieAutomaton:
    """Enum field ``k``'s automaton in a saved schema, checked as any saved automaton is
    (against ``vocab`` when given; :meth:`CompiledSchema.load` checks the file's fingerprint)."""
    entry = stored.meta["fields"][k]
    prefix = f"f{k}.automaton."
    return restore_parts(
        entry["automaton_kind"],
        entry["automaton_meta"],
        {name.removeprefix(prefix): array for name, array in stored.arrays.items() if name.startswith(prefix)},
        vocab_fingerprint=stored.header["vocab_fingerprint"],
        source=stored.source,
        field=f"f{k}.automaton",
        vocab=vocab,
    )


def restore_field(stored: storage.Stored, support: VocabularySupport, k: int, entry: dict[str, Any]) -> Field:
    """Field ``k`` of a stored schema, every table checked against its automaton, the
    vocabulary and the token pieces (a checksum-valid but inconsistent file is refused,
    never left to fail in a decoding step)."""
    arrays = stored.arrays

    def table(name: str, dtype: Any) -> npt.NDArray[Any]:
        array = arrays[f"f{k}.{name}"]
        if array.dtype != dtype:
            raise TypeError(f"f{k}.{name} is {array.dtype}, not {np.dtype(dtype)}")
        return array

    def within(name: str, array: npt.NDArray[Any], high: int) -> npt.NDArray[Any]:
        if array.size and not (int(array.min()) >= 0 and int(array.max()) < high):
            raise ValueError(f"field {k}: {name} outside [0, {high})")
        return array

    automaton = stored_field_automaton(stored, k, support.vocab)
    first, last = bytes.fromhex(entry["first"]), bytes.fromhex(entry["last"])
    pieces = support.pieces(first, last)
    if entry["pieces_fingerprint"] != pieces.fingerprint:
        raise AutomatonFileError(
            f"{stored.source} was written by a triemask that cuts tokens into other pieces: compile the schema again",
            field="pieces_fingerprint",
        )
    states = automaton.num_nodes + 1  # node ids, and the one past them that `accepting` also holds
    accepting, leaves = table("accepting", np.bool_), table("leaves", np.bool_)
    if len(accepting) != states or len(leaves) != states:
        raise ValueError(f"field {k}: {len(accepting)} and {len(leaves)} node flags for {states} nodes")
    tails = dict(
        zip(
            _unpacked(table("tails", np.uint8), table("tail_offsets", np.int64)),
            within("tail nodes", table("tail_nodes", np.int32), states).tolist(),
            strict=True,
        )
    )
    middles = dict(
        zip(
            _unpacked(table("middles", np.uint8), table("middle_offsets", np.int64)),
            within("middle nodes", table("middle_nodes", np.int32), states).tolist(),
            strict=True,
        )
    )
    crossing = within("crossing tokens", table("crossing", np.int32), len(support.tokens))
    enter_prefixes = within("prefixes", table("enter_prefixes", np.int32), len(support.prefixes)).tolist()
    enter_offsets = table("enter_offsets", np.int64)
    enter_words = within("mask words", table("enter_words", np.int64), support.width)
    enter_bits = table("enter_bits", np.int32)
    if (
        len(enter_offsets) != len(enter_prefixes) + 1
        or enter_offsets[0] != 0
        or (np.diff(enter_offsets) < 0).any()
        or enter_offsets[-1] != len(enter_words)
        or len(enter_bits) != len(enter_words)
    ):
        raise ValueError(f"field {k}: entry masks out of order or out of bounds")
    bounds = enter_offsets.tolist()
    enter_masks = {
        p: (enter_words[a:b], enter_bits[a:b]) for p, (a, b) in zip(enter_prefixes, pairwise(bounds), strict=True)
    }
    rows = table("middle_entries", np.int32)
    if len(rows) % 5:
        raise ValueError(f"field {k}: middle entries of the wrong length")
    middle_by_prefix: dict[int, list[tuple[int, int, int, int]]] = {}
    for p, token, start, end, node in rows.reshape(-1, 5).tolist():
        data = support.tokens[token] if 0 <= token < len(support.tokens) else None
        if not (0 <= p < len(support.prefixes) and data and 0 <= start < end <= len(data) and 0 <= node < states):
            raise ValueError(f"field {k}: middle entry {(p, token, start, end, node)} outside the vocabulary")
        middle_by_prefix.setdefault(p, []).append((token, start, end, node))
    exit_nodes = within("exit nodes", table("exit_nodes", np.int32), states)
    exit_pieces = within("exit pieces", table("exit_pieces", np.int32), len(pieces.pieces))
    exit_values = within("exit values", table("exit_values", np.int32), states)
    if not len(exit_nodes) == len(exit_pieces) == len(exit_values) or (np.diff(exit_nodes) < 0).any():
        raise ValueError(f"field {k}: exit tables of unequal lengths or out of order")
    sentinel = bytes.fromhex(entry["sentinel"])
    placeholders = tuple(str(p) for p in entry.get("placeholders", ()))
    if not sentinel or sentinel[0] not in SENTINEL_LEADS or len(placeholders) != len(entry["paths"]):
        raise AutomatonFileError(
            f"{stored.source} was written by a triemask whose field entries free strings could forge: "
            "compile the schema again",
            field="sentinel",
        )
    return Field(
        paths=tuple(str(p) for p in entry["paths"]),
        placeholders=placeholders,
        automaton=automaton,
        sentinel=sentinel,
        first=first,
        last=last,
        pieces=pieces,
        accepting=accepting,
        leaves=leaves,
        tails=tails,
        middles=middles,
        crossing=frozenset(crossing.tolist()),
        enter_masks=enter_masks,
        middle_by_prefix=middle_by_prefix,
        exit_nodes=exit_nodes,
        exit_pieces=exit_pieces,
        exit_values=exit_values,
        compile_seconds=float(entry["compile_seconds"]),
    )


# --------------------------------------------------------------------------- compiled schema


def schema_fingerprint(kind: str, described: Any, file_options: dict[str, Any]) -> str:
    digest = hashlib.blake2b(kind.encode(), digest_size=16)
    # the schema in its own key order (xgrammar emits properties in it), the options sorted
    digest.update(json.dumps([described, json.dumps(file_options, sort_keys=True)]).encode())
    return digest.hexdigest()


def field_sentinels(fields: Iterable[Field]) -> dict[str, bytes]:
    return {placeholder: f.sentinel for f in fields for placeholder in f.placeholders}


def _json_separators(separators: Any) -> tuple[str, str] | None:
    """``separators`` as xgrammar takes them, refused unless they are JSON's (a comma, a
    colon, optional whitespace): xgrammar would print others, and the output would not be
    JSON (nor would a value start or end where the token pieces look for it)."""
    if separators is None:
        return None
    if not (isinstance(separators, tuple | list) and len(separators) == 2 and all(type(x) is str for x in separators)):
        raise ArgumentTypeError(f"separators must be a pair of strings (items, keys), got {separators!r:.60}")
    item, key = separators
    if not (re.fullmatch("[ \t\n\r]*,[ \t\n\r]*", item) and re.fullmatch("[ \t\n\r]*:[ \t\n\r]*", key)):
        raise SchemaError(
            f"separators {separators!r:.60} are not JSON's: a ',' between items and a ':' after keys, "
            "each with optional whitespace",
            path="$",
        )
    return (item, key)


UNSUPPORTED = ("warn", "error", "ignore")
"""What ``compile_json_schema(unsupported=...)`` does with a keyword xgrammar accepts but does
not enforce (``not``, ``if``/``then``/``else``, ``uniqueItems``, ``contains``, ...): compile the
schema as xgrammar compiles it and issue one :class:`~triemask.UnenforcedSchemaWarning`
("warn", the default: a drop-in serves what the engine it replaces serves), refuse it with a
:class:`~triemask.SchemaError` naming the first such keyword ("error"), or compile it without a
warning ("ignore"); ``stats()["unenforced"]`` lists them in every case."""


@dataclass(frozen=True)
class SchemaOptions:
    """How a schema is compiled: xgrammar's options for its structure (``any_whitespace``,
    ``indent``, ``separators``, ``strict_mode``: the language is the one xgrammar compiles with
    them, kept to strict JSON), which enums go to tries (``min_enum_values``), and what a
    keyword xgrammar does not enforce gets (``unsupported``: one of :data:`UNSUPPORTED`; it
    admits or refuses a schema, never changes a language, so files and fingerprints leave it
    out), which discriminated unions go to a trie of their discriminator (``min_union_branches``).
    Checked when made: ``separators`` JSON's own, the two minimums positive integers."""

    any_whitespace: bool = True
    indent: int | None = None
    separators: tuple[str, str] | None = None
    strict_mode: bool = True
    min_enum_values: int = DEFAULT_MIN_ENUM_VALUES
    unsupported: str = "warn"
    min_union_branches: int = DEFAULT_MIN_UNION_BRANCHES

    def __post_init__(self) -> None:
        minimum = integer(self.min_enum_values, "min_enum_values", SchemaError, "a positive integer")
        if minimum < 1:
            raise SchemaError(f"min_enum_values must be at least 1, got {minimum}", path="$")
        branches = integer(self.min_union_branches, "min_union_branches", SchemaError, "a positive integer")
        if branches < 1:
            raise SchemaError(f"min_union_branches must be at least 1, got {branches}", path="$")
        object.__setattr__(self, "min_union_branches", branches)
        if not isinstance(self.unsupported, str) or self.unsupported not in UNSUPPORTED:
            choices = ", ".join(map(repr, UNSUPPORTED))
            raise SchemaError(f"unsupported must be one of {choices}, got {self.unsupported!r:.60}", path="$")
        object.__setattr__(self, "min_enum_values", minimum)
        object.__setattr__(self, "separators", _json_separators(self.separators))

    def structure(self) -> dict[str, Any]:
        """The options of xgrammar's ``Grammar.from_json_schema``."""
        return {
            "any_whitespace": self.any_whitespace,
            "indent": self.indent,
            "separators": self.separators,
            "strict_mode": self.strict_mode,
        }

    def to_file(self) -> dict[str, Any]:
        """The options as a file (and a fingerprint) holds them."""
        return {
            **self.structure(),
            "min_enum_values": self.min_enum_values,
            "min_union_branches": self.min_union_branches,
        }

    @classmethod
    def given(cls, options: dict[str, Any]) -> SchemaOptions:
        """The options of keyword arguments (None: the default); TypeError for an unknown one."""
        return cls(**{name: value for name, value in options.items() if value is not None})

    @classmethod
    def from_file(cls, options: dict[str, Any]) -> SchemaOptions:
        separators = options["separators"]
        return cls(
            any_whitespace=options["any_whitespace"],
            indent=options["indent"],
            separators=None if separators is None else tuple(separators),
            strict_mode=options["strict_mode"],
            min_enum_values=options["min_enum_values"],
            # (files written before unions were sites hold none)
            min_union_branches=options.get("min_union_branches", DEFAULT_MIN_UNION_BRANCHES),
        )
