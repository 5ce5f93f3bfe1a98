"""The C structural step of mixed schemas (``_native.SchemaCore``, ``fill_schema_rows``) against
the Python reference (``SchemaMatcher._accept_token_reference`` / ``_fill_reference``): the same
masks, answers, outputs and lexer states at every step of random walks, on a vocabulary holding
every byte and tokens that glue quotes, control bytes, surrogate bytes and 0xFF to structure.

The C fill ANDs ``Lexical.string_keep`` (refusals inside strings and of 0xFF), or
``Lexical.utf8_keep`` (less raw controls inside strings) where the grammar admits none there,
the reference the whole ``keep``; equal masks here are what shows that xgrammar's structure
allows no byte outside strings that the JSON lexer refuses, nor a raw control inside a string
of such a grammar.
"""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import byte_vocabulary
from test_schema_strictness import FREE, STRICT_MERGES, TRIE
from test_schemas import TOOLS
from triemask import (
    ArgumentTypeError,
    BitmaskError,
    Compiler,
    Matcher,
    SchemaError,
    SchemaMatcher,
    StateError,
    Vocabulary,
    fill_next_token_bitmasks,
)
from triemask.automata import native_kernel
from triemask.base import kernels
from triemask.schemas import clear_structure_cache
from triemask.schemas import matcher as matcher_module
from triemask.schemas import reading as reading_module
from triemask.schemas import support as support_module
from triemask.schemas.fields import entry_tables, exit_tables, step_flags
from triemask.schemas.json_lexer import (
    LEX_REFUSED,
    REFUSED_ANYWHERE,
    REFUSED_CONTROL,
    REFUSED_OUTSIDE,
    Lexical,
    lex_reference,
)
from triemask.schemas.structure import (
    BEGIN_NO_CHARACTER,
    VALUE_FIRST,
    controls_in_strings,
    controls_in_strings_reference,
    plain_strings,
    plain_strings_refuse_controls,
    value_end_offsets,
    value_ends,
    value_start_offsets,
    value_starts,
)
from triemask.schemas.support import split_tokens

pytest.importorskip("xgrammar")
native_only = pytest.mark.skipif(kernels.KERNELS is None, reason="the C extension is not built")

# A no-field schema with every JSON value kind, then each free-text flavour beside each trie field.
EVERY_KIND = {
    "type": "object",
    "properties": {
        "n": {"type": "number"},
        "i": {"type": "integer", "minimum": -5},
        "b": {"type": "boolean"},
        "z": {"type": "null"},
        "a": {"type": "array", "items": {}},
        "o": {"type": "object"},
        "e": {"enum": [1, "x", None, True]},
        "s": {"type": "string", "maxLength": 4},
    },
    "required": ["n", "i", "b", "z", "a", "o", "e", "s"],
}
SCHEMAS: dict[str, Any] = {
    "every kind": EVERY_KIND,
    "enums in arrays and objects": {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": TRIE["enum"], "maxItems": 3},
            "pair": {"type": "object", "properties": {"x": TRIE["enum"], "y": FREE["bounded"]}, "required": ["x"]},
            "last": TRIE["enum"],
        },
        "required": ["tags", "pair", "last"],
    },
}
for _free, _trie in [("plain", "enum"), ("bounded", "date"), ("dot pattern", "finite pattern"), ("email", "uuid")]:
    SCHEMAS[f"{_free} + {_trie}"] = {
        "type": "object",
        "properties": {"a": FREE[_free], "t": TRIE[_trie], "b": FREE["bounded"]},
        "required": ["a", "t", "b"],
    }
# Grammars that admit no raw control character inside a string (no length bound, no pattern):
# the C fill ANDs the sparser Lexical.utf8_keep there, and leaves the controls to xgrammar.
NO_CONTROLS = {
    "plain strings": {
        "type": "object",
        "properties": {"a": FREE["plain"], "o": {"type": "object"}, "l": {"type": "array", "items": FREE["plain"]}},
        "required": ["a", "o", "l"],
    },
    "plain and email + enum": {
        "type": "object",
        "properties": {"a": FREE["plain"], "t": TRIE["enum"], "e": FREE["email"], "d": TRIE["date"]},
        "required": ["a", "t", "e", "d"],
    },
}
SCHEMAS.update(NO_CONTROLS)


@pytest.fixture(scope="module")
def vocab() -> Vocabulary:
    return byte_vocabulary(STRICT_MERGES)


def state_of(matcher: SchemaMatcher) -> tuple[Any, ...]:
    return matcher.text, matcher._lexer, len(matcher._configs)


def walks_equal(compiled: Any, vocab: Vocabulary, seed: str) -> int:
    """Random walks through ``compiled``, the C steps and the reference side by side at every
    step (masks, answers for tokens in and outside the mask, outputs, lexer states, history,
    rollbacks); returns how many steps were structural."""
    width = (vocab.vocab_size + 31) // 32
    rng = random.Random(seed)
    structural_steps = 0
    for _ in range(8):
        ours, twin = Matcher(compiled), Matcher(compiled)
        assert isinstance(ours, SchemaMatcher) and isinstance(twin, SchemaMatcher)
        for _ in range(60):
            native, reference = np.zeros((2, width), dtype=np.int32), np.zeros((2, width), dtype=np.int32)
            ours.fill_next_token_bitmask(native, 1)
            twin._fill_reference(reference, 1)
            assert np.array_equal(native, reference), ours.text
            structural_steps += not ours.in_enum_value
            allowed = np.flatnonzero(np.unpackbits(native[1].view(np.uint8), bitorder="little")).tolist()
            # tokens outside the mask too: each must be refused alike, the state unchanged
            for token in rng.sample(range(vocab.vocab_size + 2), 6):
                before = state_of(ours)
                taken = ours.accept_token(token)
                assert taken == twin._accept_token_reference(token), (ours.text, token)
                if taken:
                    ours.rollback(1)
                    twin.rollback(1)
                assert state_of(ours) == state_of(twin) == before
                assert len(ours._history) == len(twin._history)
            if not allowed:
                break
            token = rng.choice(allowed)
            assert ours.accept_token(token) and twin._accept_token_reference(token)
            assert state_of(ours) == state_of(twin)
            if ours.is_terminated():
                break
            if rng.random() < 0.1:
                ours.rollback(1)
                twin.rollback(1)
                assert state_of(ours) == state_of(twin)
        assert ours.value == twin.value
    return structural_steps


@native_only
@pytest.mark.parametrize("any_whitespace", [False, True])
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_structural_step_equals_the_reference(vocab: Vocabulary, name: str, any_whitespace: bool) -> None:
    compiled = Compiler(vocab).compile_json_schema(SCHEMAS[name], min_enum_values=2, any_whitespace=any_whitespace)
    # which keep rows the C fill ANDs: the sparser ones only where no string admits a control
    assert compiled._step_tables.keep_rows == (10 if name in NO_CONTROLS else 0)
    assert walks_equal(compiled, vocab, name) > 50


@native_only
def test_tool_steps_equal_the_reference(vocab: Vocabulary) -> None:
    """A tool's name ends in its arguments' grammar (not the same matcher): the reference's."""
    compiled = Compiler(vocab).compile_tools(TOOLS, min_enum_values=2)
    assert walks_equal(compiled, vocab, "tools") > 50


@native_only
def test_batch_equals_rows(vocab: Vocabulary) -> None:
    compiler = Compiler(vocab)
    schemas = [compiler.compile_json_schema(SCHEMAS[name], min_enum_values=2) for name in sorted(SCHEMAS)]
    rng = random.Random(7)
    matchers = []
    for i in range(40):
        matcher = Matcher(schemas[i % len(schemas)])
        for _ in range(rng.randrange(40)):
            allowed = [t for t in matcher.allowed_token_ids().tolist() if t not in vocab.eos_token_ids]
            if not allowed:
                break
            matcher.accept_token(rng.choice(allowed))
        matchers.append(matcher)
    assert any(m.in_enum_value for m in matchers) and not all(m.in_enum_value for m in matchers)
    width = (vocab.vocab_size + 31) // 32
    rows = rng.sample(range(50), len(matchers))
    bitmask = np.full((50, width), -1, dtype=np.int32)
    fill_next_token_bitmasks(matchers, bitmask, rows)
    for matcher, row in zip(matchers, rows, strict=True):
        expected = np.zeros((1, width), dtype=np.int32)
        matcher._fill_reference(expected)
        assert np.array_equal(bitmask[row], expected[0])
    untouched = sorted(set(range(50)) - set(rows))
    assert (bitmask[untouched] == -1).all()
    # a tuple of matchers and of rows; no rows (row i for matcher i)
    again = np.full((50, width), -1, dtype=np.int32)
    fill_next_token_bitmasks(tuple(matchers), again, tuple(rows))
    assert np.array_equal(again, bitmask)
    in_order = np.zeros((len(matchers), width), dtype=np.int32)
    fill_next_token_bitmasks(matchers, in_order)
    assert np.array_equal(in_order, bitmask[rows])
    # every row structural and its matcher's own (xgrammar is given no indices)
    structural = [m for m in matchers if not m.in_enum_value]
    own = np.full((len(structural) + 1, width), -1, dtype=np.int32)
    fill_next_token_bitmasks(structural, own)
    assert np.array_equal(own[:-1], bitmask[[r for m, r in zip(matchers, rows, strict=True) if not m.in_enum_value]])
    assert (own[-1] == -1).all()
    # what the C checks do not take is checked in Python before anything is written
    other = Matcher(Compiler(byte_vocabulary([b"ab", b"cd" * 40])).compile_json_schema(EVERY_KIND))
    for bad, error in [
        ([*matchers[:3], other], StateError),  # another vocabulary's width
        ([*matchers[:3], object()], ArgumentTypeError),
    ]:
        untouched_mask = np.full((50, width), -1, dtype=np.int32)
        with pytest.raises(error):
            fill_next_token_bitmasks(bad, untouched_mask)  # type: ignore[arg-type]
        assert (untouched_mask == -1).all()
    with pytest.raises(StateError, match="outside"):
        fill_next_token_bitmasks(matchers[:2], bitmask, (0, 50))
    # a buffer the C side does not take (a read-only copy, then a torch tensor) fails or fills alike
    frozen = bitmask.copy()
    frozen.flags.writeable = False
    with pytest.raises(BitmaskError, match="read-only"):
        fill_next_token_bitmasks(matchers, frozen, rows)
    torch = pytest.importorskip("torch")
    tensor = torch.zeros((50, width), dtype=torch.int32)
    fill_next_token_bitmasks(matchers, tensor, rows)
    assert np.array_equal(tensor.numpy()[rows], bitmask[rows])


@native_only
def test_odd_arguments_go_to_the_reference(vocab: Vocabulary) -> None:
    compiled = Compiler(vocab).compile_json_schema(EVERY_KIND)
    ours, twin = Matcher(compiled), Matcher(compiled)
    for token in (True, np.int64(ord("{")), 2**70, -1, ord("{")):
        assert ours.accept_token(token) == twin._accept_token_reference(token)  # type: ignore[arg-type]
        assert ours.text == twin.text
    width = (vocab.vocab_size + 31) // 32
    a, b = np.zeros((1, width), dtype=np.int32), np.zeros((1, width), dtype=np.int32)
    ours.fill_next_token_bitmask(bitmask=a, row=0)
    twin._fill_reference(b)
    assert np.array_equal(a, b)
    with pytest.raises(BitmaskError):
        ours.fill_next_token_bitmask(np.zeros((1, width + 1), dtype=np.int32))
    with pytest.raises(StateError):
        ours.fill_next_token_bitmask(a, 3)
    with pytest.raises(TypeError, match=r"accept_token\(\) takes 1 argument"):
        ours.accept_token()  # type: ignore[call-arg]


@native_only
def test_step_tables_are_checked(vocab: Vocabulary) -> None:
    native = kernels.KERNELS
    assert native is not None
    good: dict[str, Any] = {
        "tokens": (b"a", None),
        "after": bytes(20),
        "keep": np.full(20, -1, dtype=np.int32),  # two sets of ten rows of one word
        "eos": bytes([0, 1, 0]),
        "pseudo_keep": np.zeros(0, dtype=np.int32),
        "sparse_offsets": np.zeros(21, dtype=np.int64),
        "sparse_words": np.zeros(0, dtype=np.int32),
        "sparse_masks": np.zeros(0, dtype=np.int32),
        "vocab_size": 3,
        "xgr_width": 1,
        "pseudo_lo": 0,
        "pseudo_hi": 0,
        "inline_pseudo": True,
    }
    lex = native.LexTables(**good)
    for name, bad in [
        ("after", bytes([11]) * 20),  # a lexer state past "refused"
        ("keep", np.full(10, -1, dtype=np.int32)),  # one set
        ("eos", bytes(2)),
        ("sparse_offsets", np.array([0] * 20 + [1], dtype=np.int64)),
        ("sparse_offsets", np.zeros(11, dtype=np.int64)),
        ("pseudo_hi", 2),
        ("xgr_width", 2),
    ]:
        with pytest.raises(ValueError, match="schema step tables"):
            native.LexTables(**{**good, name: bad})
    native.StepTables(lex=lex, crossing=bytes(2), fields=())
    native.StepTables(lex=lex, crossing=bytes(2), fields=(), controls_in_strings=False)
    automaton = Compiler(vocab).compile(["ab", "cd"], eos=False)
    kernel = native_kernel(automaton)
    flags = np.zeros(automaton.num_nodes, dtype=np.uint8)
    for crossing, fields in [
        (bytes(3), ()),  # not one flag per token
        (bytes(2), ((kernel, flags),)),  # a kernel of another vocabulary's width
        (bytes(2), ((object(), flags),)),
    ]:
        with pytest.raises(ValueError, match="schema step tables"):
            native.StepTables(lex=lex, crossing=crossing, fields=fields)


# Tokens that glue structure, whitespace, value bytes, control bytes and bytes that are not UTF-8.
_GLUE = st.lists(st.sampled_from([*b' \t\n"{}[],:\\a0-tn\x01\x1f\xed\xa0\xc3\xa9\xff']), max_size=8).map(bytes)


@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(st.one_of(st.none(), _GLUE), min_size=1, max_size=40))
def test_vocabulary_preparation_equals_the_per_token_reference(tokens: list[bytes | None]) -> None:
    """The whole-vocabulary passes (the lexer in C, value starts and ends by NumPy) against the
    per-token Python they replace."""
    table = [t for t in tokens if t != b""]  # (an empty token is not a vocabulary entry)
    vocab = Vocabulary([*table, None], eos_token_ids=[len(table)])
    lengths, offsets, data = vocab.byte_table()
    texts = [vocab.token_bytes(t) for t in range(len(lengths))]
    # the same tokens laid out apart and last first (read by a gather, not in place)
    spread, apart = b"", np.zeros(len(lengths), dtype=np.int64)
    for t in reversed(range(len(lengths))):
        apart[t], spread = len(spread) + 1, spread + b"\xff" + (texts[t] or b"")
    for first in (b'"', VALUE_FIRST):
        for table_data, table_offsets in ((data, offsets[: len(lengths)]), (spread, apart)):
            ids, at = value_starts(table_data, table_offsets, lengths, first)
            assert list(zip(ids.tolist(), at.tolist(), strict=True)) == [
                (t, j) for t, text in enumerate(texts) if text for j in value_start_offsets(text, first)
            ]
            ids, at = value_ends(table_data, table_offsets, lengths, first)
            assert list(zip(ids.tolist(), at.tolist(), strict=True)) == [
                (t, i) for t, text in enumerate(texts) if text for i in value_end_offsets(text, first)
            ]
    assert split_tokens(data, offsets[: len(lengths)], lengths) == tuple(texts)
    native, kernels.KERNELS = kernels.KERNELS, None  # the Python expression too
    try:
        assert split_tokens(data, offsets[: len(lengths)], lengths) == tuple(texts)
    finally:
        kernels.KERNELS = native
    lexical = Lexical.of(vocab, (vocab.vocab_size + 31) // 32)
    after, why = lex_reference(texts)
    assert lexical.after == tuple(row.tobytes() for row in after)
    refused = after == LEX_REFUSED
    assert np.array_equal(lexical.never, refused.all(axis=0))
    # (the sparser rows leave to xgrammar a first byte that begins no character, between a
    # string's characters: state 1)
    begins_none = np.zeros_like(refused)
    begins_none[1] = [bool(text) and text[0] in BEGIN_NO_CHARACTER for text in texts]
    for rows, dropped, left in [
        (lexical.keep, (), False),
        (lexical.string_keep, (REFUSED_OUTSIDE,), True),
        (lexical.utf8_keep, (REFUSED_OUTSIDE, REFUSED_CONTROL), True),
    ]:
        for state, row in enumerate(refused & ~np.isin(why, dropped) & ~(begins_none & left)):
            kept = np.unpackbits(rows[state].view(np.uint8), bitorder="little")[: len(texts)]
            assert np.array_equal(kept, ~row)
    # why, by hand: a control byte inside a string, a byte outside one, the sentinels' lead bytes
    for text, state, reason in [
        (b"a\n", 1, REFUSED_CONTROL),
        (b"\\\t", 1, REFUSED_CONTROL),
        (b"\x1f", 0, REFUSED_OUTSIDE),
        (b"\x01", 0, REFUSED_ANYWHERE),
        (b"\xff", 0, REFUSED_ANYWHERE),
        (b"\xed\xa0", 1, REFUSED_ANYWHERE),
    ]:
        if text in texts:
            assert why[state, texts.index(text)] == reason


def test_without_xgrammars_handle_every_step_is_the_references(
    vocab: Vocabulary, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An xgrammar whose private handle differs: no C step, the same masks (public calls)."""
    schema = SCHEMAS["plain + enum"]
    usual = Compiler(vocab).compile_json_schema(schema, min_enum_values=2)
    monkeypatch.setattr(support_module, "handles_usable", lambda: False)
    monkeypatch.setattr(matcher_module, "handles_usable", lambda: False)
    clear_structure_cache()
    plain = Compiler(vocab).compile_json_schema(schema, min_enum_values=2)
    assert plain._step_tables is None
    width = (vocab.vocab_size + 31) // 32
    rng = random.Random(3)
    ours, theirs = Matcher(plain), Matcher(usual)
    for _ in range(40):
        a, b = np.zeros((2, width), dtype=np.int32), np.zeros((2, width), dtype=np.int32)
        fill_next_token_bitmasks([ours, ours], a)
        fill_next_token_bitmasks([theirs, theirs], b)
        assert np.array_equal(a, b)
        allowed = [t for t in ours.allowed_token_ids().tolist() if t not in vocab.eos_token_ids]
        if not allowed:
            break
        token = rng.choice(allowed)
        assert ours.accept_token(token) and theirs.accept_token(token)


# Pieces of xgrammar's printed EBNF: quotes, brackets, escapes (named, hex, cut), rule names,
# calls, controls raw and escaped, non-ASCII.
_EBNF_PIECES = st.lists(
    st.sampled_from(
        [*'"[]^-\\x0nt U(a_\n\x01é|~*\t', "1f", "u00", "::=", "{0, 5}", "\\x1f", "\\0-\\x1f", "[ \\n\\r\\t]"]
    ),
    max_size=14,
).map("".join)


@native_only
@settings(max_examples=400, deadline=None)
@given(text=_EBNF_PIECES)
def test_controls_in_strings_in_c_equals_the_reference(text: str) -> None:
    native = kernels.KERNELS
    assert native is not None
    assert native.controls_in_strings(text) == controls_in_strings_reference(text), repr(text)


# JSON documents (the containers a loaded schema holds), and objects that are no JSON: tuples,
# a dict subclass, sets, which neither walk enters.
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=2), inner, max_size=4),
    max_leaves=40,
)
_NOT_ENTERED = st.tuples(_JSON) | st.builds(lambda d: type("D", (dict,), {})(d), st.dictionaries(st.text(), _JSON))


@native_only
@settings(max_examples=300, deadline=None)
@given(node=st.recursive(_JSON | _NOT_ENTERED, lambda inner: st.lists(inner, max_size=3), max_leaves=12))
def test_json_containers_in_c_equals_the_references(node: Any) -> None:
    native = kernels.KERNELS
    assert native is not None
    dicts, depth = native.json_containers(node)
    assert [id(d) for d in dicts] == [id(d) for d in reading_module._dicts_within_reference(node)]
    assert depth == reading_module._depth_reference(node)


@native_only
def test_json_containers_takes_depths_beyond_the_c_stack() -> None:
    native = kernels.KERNELS
    assert native is not None
    node: Any = {}
    for _ in range(100_000):
        node = {"a": [node]}
    dicts, depth = native.json_containers(node)
    assert (len(dicts), depth) == (100_001, 200_001)


# Schema-shaped dicts: the keywords structure_cost reads, with values of every kind.
_COSTED = st.recursive(
    _JSON,
    lambda inner: (
        st.dictionaries(
            st.sampled_from(["pattern", "format", "properties", "required", "type", "a"]),
            inner | st.lists(st.sampled_from(["a", "b", "c", "required"]) | _JSON, max_size=4),
            max_size=5,
        )
        | st.lists(inner, max_size=3)
    ),
    max_leaves=30,
)


@native_only
@settings(max_examples=300, deadline=None)
@given(node=st.recursive(_COSTED | _NOT_ENTERED, lambda inner: st.lists(inner, max_size=3), max_leaves=8))
def test_json_cost_in_c_equals_the_reference(node: Any) -> None:
    native = kernels.KERNELS
    assert native is not None
    assert reading_module.StructureCost(*native.json_cost(node)) == reading_module._structure_cost_reference(node)


def _containers(node: Any) -> list[Any]:
    found, stack = [], [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict | list):
            found.append(item)
            stack.extend(item.values() if isinstance(item, dict) else item)
    return found


_PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=2), inner, max_size=4),
    max_leaves=40,
)


@native_only
@settings(max_examples=300, deadline=None)
@given(node=st.dictionaries(st.text(max_size=2), _PLAIN, max_size=4))
def test_json_copy_in_c_is_the_json_round_trip(node: dict[str, Any]) -> None:
    native = kernels.KERNELS
    assert native is not None
    copied = native.json_copy(node)
    assert json.dumps(copied) == json.dumps(node) and copied == json.loads(json.dumps(node))
    assert not {id(c) for c in _containers(copied)} & {id(c) for c in _containers(node)}  # nothing shared
    assert reading_module.load_schema(node) == copied


# keys: annotations, keywords holding subschemas (one, a list, a map of them) and others, so
# that every kind of place holds every kind of key
_SCHEMA_KEYS = st.sampled_from(["title", "$comment", "default", "items", "not", "anyOf", "properties", "enum", "x"])
_SCHEMAS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=2),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_SCHEMA_KEYS, inner, max_size=4),
    max_leaves=40,
)


@native_only
@settings(max_examples=400, deadline=None)
@given(node=st.dictionaries(_SCHEMA_KEYS, _SCHEMAS, max_size=5))
def test_schema_without_annotations_in_c_equals_the_reference(node: dict[str, Any]) -> None:
    """The C walk removes what the reference removes, and shares every container it leaves
    as it was (the reference copies them all)."""
    native = kernels.KERNELS
    assert native is not None
    before = json.dumps(node)
    keywords = (reading_module._ONE_KEYWORDS, reading_module._LIST_KEYWORDS, reading_module._MAP_KEYWORDS)
    found = native.schema_without(node, reading_module._ANNOTATIONS, *keywords)
    expected = reading_module._without_annotations_reference(node)
    assert found == expected and json.dumps(found) == json.dumps(expected) and json.dumps(node) == before

    def shared_where_unchanged(given: Any, made: Any) -> None:
        if not isinstance(made, dict | list):
            return
        assert (made is given) == (json.dumps(made) == json.dumps(given))
        for at in made if isinstance(made, dict) else range(len(made)):
            shared_where_unchanged(given[at], made[at])

    shared_where_unchanged(node, found)


# keys _nothing_to_dispatch reads (and one it does not), values of every type it tells apart:
# strs with a lone surrogate, null, dicts (a property named "enum"), lists short and long
_DISPATCH_KEYS = st.sampled_from(["enum", "anyOf", "oneOf", "const", "pattern", "format", "not", "uniqueItems", "x"])
_DISPATCH_LEAVES = st.none() | st.booleans() | st.integers(-2, 2) | st.sampled_from(["a", "\ud800", "b\udfff"])
_DISPATCHED = st.recursive(
    _DISPATCH_LEAVES,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(_DISPATCH_KEYS, inner, max_size=4),
    max_leaves=30,
)


@native_only
@settings(max_examples=500, deadline=None)
@given(node=st.dictionaries(_DISPATCH_KEYS, _DISPATCHED, max_size=5), min_values=st.integers(1, 6))
def test_nothing_to_dispatch_in_c_equals_the_reference(node: dict[str, Any], min_values: int) -> None:
    native = kernels.KERNELS
    assert native is not None
    expected = reading_module._nothing_to_dispatch_reference(node, min_values)
    assert reading_module._nothing_to_dispatch(node, min_values) is expected
    assert reading_module._nothing_to_dispatch(node, 10**30) is reading_module._nothing_to_dispatch_reference(
        node, 10**30
    )


@pytest.mark.parametrize(
    ("node", "plain"),
    [
        ({"type": "object", "properties": {"enum": {"type": "string"}}}, True),  # a property named "enum"
        ({"enum": ["a", 1, None]}, True),
        ({"enum": None, "anyOf": [{"type": "string"}, {"type": "null"}]}, True),
        ({"enum": ["a", "b", "c", "d"]}, False),  # as many as min_values: perhaps a trie
        ({"enum": []}, False),
        ({"enum": ["\ud800"]}, False),  # (the full visit names it)
        ({"anyOf": [{"const": 1}]}, False),
        ({"oneOf": [{}, {}, {}, {}]}, False),
        ({"type": "string", "pattern": "a+"}, False),
        ({"type": "string", "format": "date"}, False),
        ({"type": "array", "uniqueItems": True}, False),
        ({"pattern": 1, "format": None}, True),  # (not strs: xgrammar's to refuse)
    ],
)
def test_nothing_to_dispatch_clears_plain_schemas_only(node: dict[str, Any], plain: bool) -> None:
    assert reading_module._nothing_to_dispatch_reference(node, 4) is plain
    assert reading_module._nothing_to_dispatch(node, 4) is plain


@native_only
def test_schema_without_takes_frozensets_only_and_leaves_deep_schemas() -> None:
    native = kernels.KERNELS
    assert native is not None
    sets = (frozenset({"title"}), frozenset({"not"}), frozenset({"anyOf"}), frozenset({"properties"}))
    with pytest.raises(TypeError):
        native.schema_without({}, {"title"}, *sets[1:])
    deep: dict[str, Any] = {"title": "t"}
    for _ in range(300):
        deep = {"not": deep, "title": "t"}
    assert native.schema_without(deep, *sets) is None
    assert native.schema_without({"not": {"title": "t", "x": 1}}, *sets) == {"not": {"x": 1}}


def _cycle() -> dict[str, Any]:
    node: dict[str, Any] = {"a": []}
    node["a"].append(node)
    return node


def _nested(levels: int) -> dict[str, Any]:
    node: dict[str, Any] = {}
    for _ in range(levels):
        node = {"a": node}
    return node


@native_only
@pytest.mark.parametrize(
    ("node", "loaded"),
    [
        ({"enum": ("a", "b")}, {"enum": ["a", "b"]}),  # a tuple: the round trip makes it a list
        ({"a": {1: "x", None: "y"}}, {"a": {"1": "x", "null": "y"}}),  # keys json.dumps converts
        ({"a": type("S", (str,), {})("x")}, {"a": "x"}),  # a str subclass
        ({"a": type("D", (dict,), {})(b=1)}, {"a": {"b": 1}}),
        ({"a": float("nan")}, "not JSON-serialisable: Out of range float values"),
        ({"a": {1.5j}}, "not JSON-serialisable: Object of type set"),
        (_cycle(), "not JSON-serialisable: Circular reference detected"),
        (_nested(300), "nested too deeply: 301 levels, more than 128"),
    ],
)
def test_json_copy_leaves_what_is_not_plain_to_the_round_trip(node: dict[str, Any], loaded: Any) -> None:
    native = kernels.KERNELS
    assert native is not None
    assert native.json_copy(node) is None
    if isinstance(loaded, dict):
        assert reading_module.load_schema(node) == loaded
    else:
        with pytest.raises(SchemaError, match=loaded):
            reading_module.load_schema(node)


@pytest.mark.parametrize(
    ("schema", "controls"),
    [
        ({"type": "string"}, False),
        ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "number"}}}}, False),
        ({"type": "string", "format": "email"}, False),
        ({"const": "a\u0001b"}, False),  # (JSON-escaped in the literal: no raw control)
        ({"type": "string", "maxLength": 5}, True),
        ({"type": "string", "minLength": 1}, True),
        ({"type": "string", "pattern": "^a.b$"}, True),
        ({"type": "object", "additionalProperties": {"type": "string", "maxLength": 3}}, True),
    ],
)
def test_controls_in_strings_reads_xgrammars_grammars(schema: dict[str, Any], controls: bool) -> None:
    import xgrammar

    for any_whitespace in (False, True):
        text = str(xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=any_whitespace))
        assert controls_in_strings_reference(text) is controls
        assert controls_in_strings(text) is controls


_PLAIN_OPTIONS = {"indent": None, "separators": None}


@pytest.mark.parametrize(
    ("schema", "plain"),
    [
        ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "number", "minimum": 1}}}}, True),
        ({"type": "object", "properties": {"format": {"enum": ["a", "b"]}, "pattern": {}}}, True),  # property names
        ({"type": "object", "additionalProperties": True, "properties": {"k": {"const": "v w"}}}, True),
        ({"type": "string", "maxLength": 5}, False),
        ({"type": "string", "minLength": 1}, False),
        ({"type": "string", "pattern": "^a.b$"}, False),
        ({"type": "string", "format": "email"}, False),
        ({"type": "object", "patternProperties": {"^x": {"type": "integer"}}}, False),
        ({"type": "object", "propertyNames": {"maxLength": 3}}, False),
        ({"type": "object", "properties": {"a\u0001": {"type": "string"}}, "additionalProperties": True}, False),
        ({"const": 'a"b'}, False),  # (an escape: read from the grammar)
    ],
)
def test_plain_strings_reads_the_schema_text(schema: dict[str, Any], plain: bool) -> None:
    import xgrammar

    text = json.dumps(schema)
    assert plain_strings(text, _PLAIN_OPTIONS) is plain
    assert not plain_strings(text, {"indent": 2, "separators": None})
    assert not plain_strings(text, {"indent": None, "separators": (",", ":")})
    for any_whitespace in (False, True):
        for strict_mode in (False, True):
            printed = str(
                xgrammar.Grammar.from_json_schema(text, any_whitespace=any_whitespace, strict_mode=strict_mode)
            )
            assert not (plain and controls_in_strings(printed))
    assert plain_strings_refuse_controls()


_NAMES = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), max_size=3),
    st.sampled_from(["format", "pattern", "type", "\x01", "a\x1fb", 'q"', "\\"]),
)
_LEAVES = st.one_of(
    st.sampled_from(
        [
            {"type": "string"},
            {"type": "string", "maxLength": 4},
            {"type": "string", "minLength": 1},
            {"type": "string", "format": "email"},
            {"type": "string", "pattern": "[^x]*"},
            {"type": "number", "minimum": 1},
            {"type": "integer", "maximum": 9},
            {"type": "boolean"},
            {},
        ]
    ),
    st.builds(lambda value: {"const": value}, st.text(st.characters(exclude_categories=("Cs",)), max_size=4)),
    st.builds(lambda values: {"enum": values}, st.lists(st.text(max_size=3) | st.integers(), min_size=1, max_size=3)),
)
_SCHEMAS = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(
        st.builds(
            lambda properties, more: {"type": "object", "properties": properties, "additionalProperties": more},
            st.dictionaries(_NAMES, inner, max_size=3),
            st.booleans() | inner,
        ),
        st.builds(lambda items: {"type": "array", "items": items}, inner),
        st.builds(lambda branches: {"anyOf": branches}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda names: {"type": "object", "propertyNames": names}, inner),
        st.builds(lambda keyed: {"type": "object", "patternProperties": {"^k": keyed}}, inner),
    ),
    max_leaves=6,
)


@settings(max_examples=150, deadline=None)
@given(schema=_SCHEMAS)
def test_plain_strings_never_hides_a_control(schema: dict[str, Any]) -> None:
    """Where the schema's text says its strings are plain, xgrammar's printed grammar admits
    no raw control in a string, whatever the property names, consts and nesting."""
    import xgrammar

    text = json.dumps(schema)
    if not plain_strings(text, _PLAIN_OPTIONS):
        return
    for any_whitespace in (False, True):
        for strict_mode in (False, True):
            try:
                grammar = xgrammar.Grammar.from_json_schema(
                    text, any_whitespace=any_whitespace, strict_mode=strict_mode
                )
            except RuntimeError:  # (a schema xgrammar refuses: nothing to read)
                continue
            assert not controls_in_strings(str(grammar)), text


@pytest.mark.parametrize(
    "text",
    [
        'root ::= "a',  # a literal left open
        "root ::= [a",  # a class left open
        'root ::= Regex("a")',  # a construct called by name
        'root ::= ("a" | [\\x01])',  # a control in a class
        "root ::= [^\\0-\\x1e]",  # a negated class that leaves 0x1F
        'root ::= "\\q"',  # an unknown escape
        "root ::= [\\t\\na]",  # whitespace mixed with other characters
        'root ::= "x\\n"',  # a literal with a newline beside text
        "root ::= [^\\0-\\x1f] ~",  # a character the printer never writes between items
    ],
)
def test_controls_in_strings_is_true_where_it_cannot_tell(text: str) -> None:
    assert controls_in_strings_reference(text) and controls_in_strings(text)


@native_only
@pytest.mark.parametrize("name", ["plain + enum", "enums in arrays and objects", "plain and email + enum"])
def test_steps_where_a_token_holds_a_whole_value_equal_the_reference(name: str) -> None:
    """Tokens that hold a whole value and go on (``"no",``, ``"x"}``, ``["x"]``): where one may
    follow a structural prefix the C fill leaves the row to the reference, elsewhere it enters
    fields itself; both the same masks as the reference at every step."""
    vocab = byte_vocabulary([*STRICT_MERGES, b'"no",', b'"x"}', b'["x"]', b': "no"}'])
    compiled = Compiler(vocab).compile_json_schema(SCHEMAS[name], min_enum_values=2)
    assert any(f.middle_by_prefix for f in compiled._fields)
    assert walks_equal(compiled, vocab, name) > 50


@native_only
def test_tokens_that_enter_or_leave_a_value_step_in_c(monkeypatch: pytest.MonkeyPatch) -> None:
    """A token that enters a field's value at one place (`` "``) or ends it and goes on in the
    structure (``",``) is a C step (xgrammar's matcher takes the string in place, no fork):
    no call of the reference along a walk, masks and rollback equal to the reference's."""
    merges = [b' "', b'",', b'"}', b"ab", b'"x']
    vocab = byte_vocabulary(merges)
    schema = {
        "type": "object",
        "properties": {"t": {"enum": ["ab", "abc", "x", "xy"]}, "u": {"enum": ["ab", "x"]}, "n": {"type": "string"}},
        "required": ["t", "u", "n"],
    }
    compiled = Compiler(vocab).compile_json_schema(schema, min_enum_values=2, separators=(",", ": "))
    text = [b"{", b'"', b"t", b'"', b":", b' "', b"ab", b'",', b'"', b"u", b'"', b":", b' "', b"x", b'",']
    text += [b'"', b"n", b'"', b":", b' "', b"q", b'"}']
    ids = {piece: 256 + i for i, piece in enumerate(merges)} | {bytes([b]): b for b in range(256)}
    tokens = [ids[piece] for piece in text]
    deferred: list[int] = []
    reference = SchemaMatcher._accept_token_reference
    monkeypatch.setattr(
        SchemaMatcher, "_accept_token_reference", lambda self, token: deferred.append(token) or reference(self, token)
    )
    ours, twin = SchemaMatcher(compiled, max_rollback=64), SchemaMatcher(compiled, max_rollback=64)
    width = (vocab.vocab_size + 31) // 32
    native, expected = np.zeros((1, width), dtype=np.int32), np.zeros((1, width), dtype=np.int32)
    for token in tokens:
        ours.fill_next_token_bitmask(native)
        twin._fill_reference(expected)
        assert np.array_equal(native, expected), ours.text
        assert ours.accept_token(token) and reference(twin, token)
    assert deferred == [] and ours.value == twin.value == {"t": "ab", "u": "x", "n": "q"}
    for _ in tokens:  # back through the values' entries and ends, one step at a time
        ours.rollback(1)
        twin.rollback(1)
        ours.fill_next_token_bitmask(native)
        twin._fill_reference(expected)
        assert np.array_equal(native, expected) and state_of(ours) == state_of(twin)
    # Where the structure reads the token too (a union of the enum and a free string), or it
    # goes on inside the value as well as ending it ("ab" and "abc"), every reading is the
    # reference's; the in-place tries leave the matcher as they found it.
    union = {"type": "object", "properties": {"t": {"anyOf": [schema["properties"]["t"], {"type": "string"}]}}}
    compiled = Compiler(vocab).compile_json_schema(union, min_enum_values=2, separators=(",", ": "))
    for text in (
        [b"{", b'"', b"t", b'"', b":", b' "', b"ab", b'"}'],
        [b"{", b'"', b"t", b'"', b":", b' "', b"ab", b"c", b'"}'],
    ):
        ours, twin = SchemaMatcher(compiled), SchemaMatcher(compiled)
        deferred.clear()
        for token in [ids[piece] for piece in text]:
            ours.fill_next_token_bitmask(native)
            twin._fill_reference(expected)
            assert np.array_equal(native, expected), ours.text
            assert ours.accept_token(token) and reference(twin, token)
            assert state_of(ours) == state_of(twin)
        assert ids[b' "'] in deferred and ours.value == twin.value


@native_only
def test_exit_and_entry_tables_are_checked(vocab: Vocabulary) -> None:
    """Every index the C fills around a value read is checked when the tables are built."""
    compiled = Compiler(vocab).compile_json_schema(SCHEMAS["plain + enum"], min_enum_values=2)
    support = compiled._support
    field = compiled._fields[0]
    kernel = native_kernel(field.automaton)
    exits = exit_tables(field)
    entries = entry_tables(compiled._fields, compiled._fields_by_prefix, support.prefixes)
    good = {
        "lex": support.lex_tables,
        "crossing": np.zeros(len(support.tokens), dtype=np.uint8),
        "fields": ((kernel, step_flags(field), exits),),
        "plain_exits": True,
        "starts_first": compiled._starts_first,
        "entries": entries,
        "first_pseudo": support.first_pseudo,
    }
    native = kernels.KERNELS
    assert native is not None
    native.StepTables(**good)

    def exits_with(index: int, value: Any) -> tuple[Any, ...]:
        return (*exits[:index], value, *exits[index + 1 :])

    bad_exits = [
        exits_with(0, np.full(len(exits[0]), field.automaton.num_nodes, dtype=np.int32)),  # a node past the trie
        exits_with(1, np.full(len(exits[1]), len(field.pieces.pieces) + 5, dtype=np.int32)),  # a piece past them
        exits_with(3, np.full(len(exits[3]), len(support.tokens), dtype=np.int64)),  # a token past them
        exits_with(4, np.full(len(exits[4]), 1 << 20, dtype=np.int32)),  # a head's end past its token
        exits_with(5, np.full_like(exits[5], 1 << 40)),  # a lookup past xgrammar's vocabulary
        exits[:-1],
    ]
    for bad in bad_exits:
        with pytest.raises(ValueError, match="schema step tables"):
            native.StepTables(**{**good, "fields": ((kernel, step_flags(field), bad),)})
    prefix = next(p for p, here in enumerate(entries) if here and len(here[0][2]))
    k, text, words, bits, middles = entries[prefix][0]
    for bad_entry in [
        (5, text, words, bits, middles),  # a field past the schema's
        (k, text, np.full_like(words, 1 << 30), bits, middles),  # a word past the row
        (k, text, words[:0], bits, middles),  # words and bits of other lengths
        (k, "text", words, bits, middles),
    ]:
        changed = (*entries[:prefix], (bad_entry, *entries[prefix][1:]), *entries[prefix + 1 :])
        with pytest.raises(ValueError, match="schema step tables"):
            native.StepTables(**{**good, "entries": changed})
    with pytest.raises(ValueError, match="schema step tables"):
        native.StepTables(**{**good, "first_pseudo": 1 << 30})


@native_only
@settings(max_examples=80, deadline=None)
@given(
    maxlen=st.integers(0, 20),
    operations=st.lists(st.one_of(st.just("pop"), st.just("clear"), st.integers(0, 10**12)), max_size=80),
)
def test_history_is_a_deque_of_steps(maxlen: int, operations: list[Any]) -> None:
    """The C ring a schema matcher's rollback history lives in (``_native.History``) does what
    ``deque(maxlen=...)`` of the step tuples does: appends past maxlen drop the oldest, pop
    returns the newest, clear, len, iteration oldest first, maxlen; wrapping and growing."""
    from collections import deque

    ring, reference = kernels.KERNELS.History(maxlen), deque(maxlen=maxlen)
    shared = [object()]  # (configurations may be shared by consecutive steps)
    for i, operation in enumerate(operations):
        if operation == "pop":
            if reference:
                assert ring.pop() == reference.pop()
            else:
                with pytest.raises(IndexError):
                    ring.pop()
        elif operation == "clear":
            ring.clear()
            reference.clear()
        else:
            step = (shared if i % 3 else [i], operation, i % 7, None if i % 2 else object())
            ring.append(step)
            reference.append(step)
        assert len(ring) == len(reference) and list(ring) == list(reference)
    assert ring.maxlen == maxlen
    with pytest.raises(TypeError):
        ring.append(([], 1, 2))  # (three fields: not a step)
    with pytest.raises(ValueError):
        kernels.KERNELS.History(-1)


@native_only
def test_matchers_keep_their_history_in_the_c_ring(vocab: Vocabulary) -> None:
    """A schema matcher built with the extension records its steps in ``_native.History`` (no
    tuple a step), keeping the newest max_rollback; rollback, copy and reset read it as they
    read a deque, and a matcher without history refuses to roll back."""
    compiled = Compiler(vocab).compile_json_schema(SCHEMAS["plain strings"], min_enum_values=2)
    rng = random.Random(3)
    matcher, steps = SchemaMatcher(compiled, max_rollback=5), []
    assert type(matcher._history) is kernels.KERNELS.History and matcher._history.maxlen == 5
    for _ in range(12):
        allowed = [t for t in matcher.allowed_token_ids().tolist() if t not in vocab.eos_token_ids]
        if not allowed:
            break
        steps.append(rng.choice(allowed))
        assert matcher.accept_token(steps[-1])
    assert len(steps) == 12 and len(matcher._history) == 5
    twin = matcher.copy()
    assert [step[1:3] for step in twin._history] == [step[1:3] for step in matcher._history]
    matcher.rollback(5)
    fresh = SchemaMatcher(compiled)
    assert fresh.accept_tokens(steps[:7]) == 7
    assert matcher.text == fresh.text and matcher._lexer == fresh._lexer
    with pytest.raises(StateError, match="max_rollback=5"):
        matcher.rollback(1)
    assert twin.accept_tokens(steps[12:]) == 0 and len(twin._history) == 5  # (the copy kept its own)
    twin.reset()
    assert len(twin._history) == 0 and twin.text == b""
    none = SchemaMatcher(compiled, max_rollback=0)
    assert none.accept_token(steps[0]) and len(none._history) == 0
    with pytest.raises(StateError):
        none.rollback(1)


@native_only
@pytest.mark.parametrize("name", ["bounded + date", "email + uuid", "plain and email + enum"])
def test_steps_inside_a_value_make_their_list_when_read(vocab: Vocabulary, name: str) -> None:
    """A step inside a field's value makes no list of configurations (the matcher keeps the
    node, and its history the configuration and the node): after runs of such steps that
    nothing reads, the masks, rollback one step at a time and a copy give what the reference
    gives."""
    compiled = Compiler(vocab).compile_json_schema(SCHEMAS[name], min_enum_values=2)
    width = (vocab.vocab_size + 31) // 32
    rng = random.Random(name)
    inside = 0
    for _ in range(12):
        ours, twin = SchemaMatcher(compiled, max_rollback=64), SchemaMatcher(compiled, max_rollback=64)
        native, reference = np.zeros((1, width), dtype=np.int32), np.zeros((1, width), dtype=np.int32)
        for _ in range(60):
            ours.fill_next_token_bitmask(native)  # (nothing of ours read but its rows and answers)
            twin._fill_reference(reference)
            assert np.array_equal(native, reference), twin.text
            allowed = np.flatnonzero(np.unpackbits(native[0].view(np.uint8), bitorder="little")).tolist()
            allowed = [t for t in allowed if t not in vocab.eos_token_ids]
            if not allowed:
                break
            inside += twin.in_enum_value
            token = rng.choice(allowed)
            assert ours.accept_token(token) and twin._accept_token_reference(token)
            if rng.random() < 0.2:  # (back into a run of such steps, or to its start)
                back = min(rng.randint(1, 3), len(twin._history))
                ours.rollback(back)
                twin.rollback(back)
        copied = ours.copy()
        for _ in range(len(twin._history)):
            for matcher in (ours, copied, twin):
                matcher.rollback(1)
            twin._fill_reference(reference)
            for matcher in (ours, copied):  # (their configurations unread: the masks say where they are)
                matcher.fill_next_token_bitmask(native)
                assert np.array_equal(native, reference), twin.text
                assert (matcher.text, matcher._lexer) == (twin.text, twin._lexer)
        assert state_of(ours) == state_of(copied) == state_of(twin) == (b"", 0, 1)
    assert inside > 10
