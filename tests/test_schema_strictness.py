"""Trie fields beside free text: entering a field cannot be forged from inside a string, and
every output is strict JSON that validates (issue 23).

xgrammar compiles a length-bounded string to ``"\\"" [^"\\\\\\r\\n]{0,n} "\\""``, a class that admits
raw control bytes, and patterns and formats to classes of their own. Each walk here puts free
strings of every kind before, after and between trie fields (enums, finite patterns, formats,
tool names), on a vocabulary holding every byte as a token plus tokens that glue quotes,
backslashes, control bytes, surrogate bytes and value bytes; every token where triemask and
xgrammar's whole-schema matcher differ is judged by the language (``compare_walks``).
"""

from __future__ import annotations

import gzip
import json
import os
from importlib import resources
from typing import Any

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import byte_vocabulary, real_compiler, real_vocabulary
from oracle import strict_json_prefix
from test_schemas import compare_walks, glued_tokens, reference_compiler, tools_as_any_of
from triemask import (
    ArgumentTypeError,
    AutomatonFileError,
    CompiledSchema,
    Compiler,
    Matcher,
    SchemaError,
    SchemaMatcher,
    Vocabulary,
)
from triemask.base import storage as _storage
from triemask.schemas import structure as _structure
from triemask.schemas.structure import check_entry_unforgeable

xgr = pytest.importorskip("xgrammar")

# Free text of every kind xgrammar builds (the structure's, never a trie's).
FREE = {
    "plain": {"type": "string"},
    "bounded": {"type": "string", "maxLength": 5},
    "at least": {"type": "string", "minLength": 2},
    "negated pattern": {"type": "string", "pattern": "[^a]{0,6}"},
    "dot pattern": {"type": "string", "pattern": "^.{1,8}$"},
    "time": {"type": "string", "format": "time"},
    "email": {"type": "string", "format": "email"},
    "bounded array": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
}
ENUM = ["x", "xy", 'q"t', "a\tb", "é", "yes", "no"]
ENUM_KEYS = {"enum": ["alpha", "beta", "x", "xy"]}
# Fields that go to triemask automata (with min_enum_values=2).
TRIE = {
    "enum": {"enum": ENUM},
    "finite pattern": {"type": "string", "pattern": "[a-c]{1,2}(x|é)?"},
    "date": {"type": "string", "format": "date"},
    "uuid": {"type": "string", "format": "uuid"},
}
# Tokens that glue structure, control bytes, backslashes, surrogate and non-UTF-8 bytes and
# value bytes (the vocabulary also has every single byte).
STRICT_MERGES = [
    b'"\t',
    b'\t"',
    b"a\t",
    b'\x01"',
    b'"\x01',
    b"\\\t",
    b"\t,",
    b'",\t"',
    b'"\n',
    b'\r"',
    b'": "\x01',
    b'": "\t',
    b'"a',
    b'"x',
    b'x"',
    b'xy"',
    b'x",',
    b'x"}',
    b'": "',
    b'", "',
    b'"}',
    b'"]',
    b'["',
    b'{"',
    b'"yes',
    b'"no"',
    b'no"}',
    b"\\u00",
    b'\\"',
    b"\xed\xa0",
    b"\xed\xa0\x80",
    b"\xed\x9f\xbf",
    b'"\xff',
    b"\xff\x10",
    b"\xc3\xa9",
    b'\xc3\xa9"',
    b"20",
    b"-0",
    b'"2',
    b"ab",
    b'"ab',
    b"bx",
    b'bx"',
]


@pytest.fixture(scope="module")
def strict_vocab() -> Vocabulary:
    return byte_vocabulary(STRICT_MERGES)


@pytest.fixture(scope="module")
def strict_compiler(strict_vocab: Vocabulary) -> Compiler:
    return Compiler(strict_vocab)


def object_of(kinds: list[str]) -> dict[str, Any]:
    properties = {f"f{i}": {**FREE, **TRIE}[kind] for i, kind in enumerate(kinds)}
    return {"type": "object", "properties": properties, "required": list(properties)}


def check(
    compiler: Compiler, vocab: Vocabulary, schema: dict[str, Any], *, walks: int, steps: int, seed: int, **options: Any
) -> int:
    compiled = compiler.compile_json_schema(schema, min_enum_values=2, **options)
    assert compiled.stats()["trie_fields"], "a field went to a trie"
    reference = reference_compiler(vocab).compile_json_schema(json.dumps(schema), **options)
    return compare_walks(compiled, reference, vocab, walks=walks, steps=steps, seed=seed)


@pytest.mark.parametrize("free", sorted(FREE))
@pytest.mark.parametrize("trie", sorted(TRIE))
def test_free_text_before_after_and_between_trie_fields(
    strict_vocab: Vocabulary, strict_compiler: Compiler, free: str, trie: str
) -> None:
    schema = object_of([free, trie, free, trie])
    check(
        strict_compiler, strict_vocab, schema, walks=4, steps=40, seed=len(free) * 7 + len(trie), any_whitespace=False
    )


@pytest.mark.parametrize("any_whitespace", [False, True])
def test_nested_and_in_arrays(strict_vocab: Vocabulary, strict_compiler: Compiler, any_whitespace: bool) -> None:
    inner = object_of(["bounded", "enum", "negated pattern", "finite pattern"])
    schema = {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": inner, "maxItems": 2},
            "tags": {"type": "array", "items": {"anyOf": [TRIE["enum"], FREE["bounded"]]}, "maxItems": 3},
            "note": FREE["bounded"],
        },
        "required": ["items", "tags", "note"],
    }
    check(strict_compiler, strict_vocab, schema, walks=8, steps=60, seed=3, any_whitespace=any_whitespace)


def test_tool_names_beside_bounded_arguments(strict_vocab: Vocabulary, strict_compiler: Compiler) -> None:
    tools = [
        {"name": name, "parameters": object_of(["bounded", "enum", "dot pattern"])} for name in ("x", "xy", "no")
    ] + [{"name": "yes", "parameters": object_of(["negated pattern", "date"])}]
    compiled = strict_compiler.compile_tools(tools, any_whitespace=False, min_enum_values=2)
    schema = tools_as_any_of(tools)
    reference = reference_compiler(strict_vocab).compile_json_schema(json.dumps(schema), any_whitespace=False)
    compare_walks(compiled, reference, strict_vocab, walks=12, steps=50, seed=5, schema=schema)


def test_raw_control_bytes_and_surrogates_are_refused_in_strings(
    strict_vocab: Vocabulary, strict_compiler: Compiler
) -> None:
    schema = {"type": "object", "properties": {"a": FREE["bounded"], "b": TRIE["enum"]}, "required": ["a", "b"]}
    compiled = strict_compiler.compile_json_schema(schema, any_whitespace=False, min_enum_values=2)
    matcher = Matcher(compiled)
    assert isinstance(matcher, SchemaMatcher)
    assert matcher.accept_tokens([*b'{"a": "x']) == 8
    ids = {data: t for t in range(len(strict_vocab)) if (data := strict_vocab.token_bytes(t))}
    allowed = set(matcher.allowed_token_ids().tolist())
    for refused in (b"\t", b"\x01", b"\x1f", b"a\t", b"\xff", b'"\xff', b'"\x01', b"\xed\xa0"):
        assert ids[refused] not in allowed and not matcher.accept_token(ids[refused]), refused
    assert matcher.accept_token(ids[b"\xed"])  # a Hangul syllable's first byte; then 0x80-0x9F only
    allowed = set(matcher.allowed_token_ids().tolist())
    assert ids[b"\x9f"] in allowed and ids[b"\xa0"] not in allowed
    assert matcher.accept_tokens([ids[b"\x9f"], ids[b"\xbf"], ids[b'"'], *b', "b": "x"}']) == 14
    assert matcher.value == {"a": "x\ud7ff", "b": "x"}
    # outside strings JSON's whitespace stays allowed: {"a":\t"...
    spaced = strict_compiler.compile_json_schema(schema, any_whitespace=True, min_enum_values=2)
    matcher = Matcher(spaced)
    assert matcher.accept_tokens([*b'{"a":', ids[b"\t"]]) == 6
    assert not matcher.accept_token(ids[b'"\t'])  # a raw tab inside the string
    assert matcher.accept_token(ids[b'"']) and not matcher.accept_token(ids[b"\t"])


def test_saved_schemas_from_before_are_refused(strict_compiler: Compiler, tmp_path: Any) -> None:
    """A file whose fields carry 0x01 sentinels over strings that admit raw controls (forgeable
    there: files from before issue 23) is refused, never served."""
    compiled = strict_compiler.compile_json_schema(object_of(["bounded", "enum"]), min_enum_values=2)
    meta, arrays = compiled._file_parts()
    for entry in meta["fields"]:
        entry["sentinel"] = "01" + entry["sentinel"][2:]
        del entry["placeholders"]
    path = tmp_path / "old.triemask"
    _storage.write(path, "schema", meta, arrays, vocab_fingerprint=compiled.vocab_fingerprint, set_fingerprint="x")
    with pytest.raises(AutomatonFileError) as raised:
        CompiledSchema.load(path, vocab=strict_compiler)
    assert raised.value.field == "sentinel"


# ----------------------------------------------------------------------------- properties

_GLUE = [b'"', b'",', b'", "', b'": "', b'":', b'"}', b'"]', b"{", b"[", b", ", b"\\", b"\t", b"\x01", b"\n", b"\xed"]
_VALUE_TEXT = 'xy"\\é\t\x01 ,}'


@settings(
    max_examples=int(os.environ.get("TRIEMASK_SCHEMA_EXAMPLES", "20")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    kinds=st.lists(st.sampled_from(sorted({**FREE, **TRIE})), min_size=2, max_size=5).filter(
        lambda kinds: any(k in TRIE for k in kinds)
    ),
    shape=st.sampled_from(["object", "nested", "array"]),
    merges=glued_tokens(_GLUE, _VALUE_TEXT, 30),
    any_whitespace=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_random_free_text_beside_trie_fields(
    kinds: list[str], shape: str, merges: list[bytes], any_whitespace: bool, seed: int
) -> None:
    inner = object_of(kinds)
    schema = {
        "object": inner,
        "nested": {"type": "object", "properties": {"n": inner, "s": FREE["bounded"]}, "required": ["n", "s"]},
        "array": {"type": "array", "items": inner, "maxItems": 2},
    }[shape]
    vocab = byte_vocabulary(merges)
    check(Compiler(vocab), vocab, schema, walks=4, steps=30, seed=seed, any_whitespace=any_whitespace)


# ----------------------------------------------------------------------------- real vocabularies


def names(count: int) -> list[str]:
    with resources.files("triemask").joinpath("data", "tool_registry_10k.txt.gz").open("rb") as handle:
        return gzip.decompress(handle.read()).decode().split()[:count]


def label_reason_score() -> dict[str, Any]:
    """The issue's schema: a label of 300 names (a trie at the default threshold), a short
    free-text reason, a score."""
    return {
        "type": "object",
        "properties": {
            "label": {"type": "string", "enum": names(300)},
            "reason": {"type": "string", "maxLength": 60},
            "score": {"type": "integer"},
        },
        "required": ["label", "reason", "score"],
    }


# Real argument schemas of the issue's shape: enum and finite pattern (or format) fields
# beside length-bounded and free strings.
REAL_SCHEMAS: dict[str, dict[str, Any]] = {
    "label, reason, score": label_reason_score(),
    "name and day": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 64}, "day": {"type": "string", "format": "date"}},
        "required": ["name", "day"],
    },
    "create issue": {
        "type": "object",
        "properties": {
            "repo": {"type": "string", "pattern": "^[a-z]{2,6}/[a-z]{2,6}$"},
            "title": {"type": "string", "minLength": 1, "maxLength": 80},
            "body": {"type": "string"},
            "labels": {"type": "array", "items": {"enum": names(260)}, "maxItems": 3},
            "due": {"type": "string", "format": "date"},
        },
        "required": ["repo", "title", "labels"],
    },
    "ticket": {
        "type": "object",
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "priority": {"enum": ["low", "medium", "high", "urgent"]},
            "code": {"type": "string", "pattern": "^[A-Z][0-9]{2}\\.[0-9]{1,2}$"},
            "summary": {"type": "string", "maxLength": 40},
            "contact": {"type": "string", "format": "email"},
            "steps": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3},
        },
        "required": ["id", "priority", "code", "summary", "steps"],
    },
    "book flight": {
        "type": "object",
        "properties": {
            "origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "date": {"type": "string", "format": "date"},
            "passenger": {"type": "string", "minLength": 2, "maxLength": 40},
            "cabin": {"enum": ["economy", "premium_economy", "business", "first"]},
            "notes": {"type": "string", "maxLength": 100},
        },
        "required": ["origin", "destination", "date", "passenger", "cabin"],
    },
    "calendar event": {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 50},
            "day": {"type": "string", "format": "date"},
            "start": {"type": "string", "format": "time"},
            "room": {"enum": [f"room-{i:03d}" for i in range(300)]},
            "attendees": {"type": "array", "items": {"type": "string", "format": "email"}, "maxItems": 3},
        },
        "required": ["title", "day", "start", "room"],
    },
    "search products": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "maxLength": 60},
            "category": {"enum": names(400)},
            "sku": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{4}$"},
            "filters": {
                "type": "object",
                "properties": {"brand": {"type": "string", "maxLength": 20}, "color": {"type": "string"}},
            },
        },
        "required": ["query", "category"],
    },
}


def test_qwen_issue_regression() -> None:
    """Inside a length-bounded string, the token ``"a`` no longer enters the label's trie;
    the outputs of the issue are refused token by token."""
    compiler, real = real_compiler("qwen2"), real_vocabulary("qwen2")
    schema = label_reason_score()
    compiled = compiler.compile_json_schema(schema, any_whitespace=False)
    assert compiled.stats()["trie_fields"][0]["values"] == 300
    label = schema["properties"]["label"]["enum"][0]
    matcher = Matcher(compiled)
    assert isinstance(matcher, SchemaMatcher)
    prefix = real.encode(f'{{"label": "{label}", "reason": "')
    assert matcher.accept_tokens(prefix) == len(prefix)
    (quote_a,) = real.encode('"a')
    assert quote_a not in matcher.allowed_token_ids() and not matcher.accept_token(quote_a)
    tab = real.encode("\t")[0]
    assert not matcher.accept_token(tab)
    day = compiler.compile_json_schema(REAL_SCHEMAS["name and day"], any_whitespace=False)
    forged = real.encode('{"name": "Bob"2024-01-01"}')
    assert Matcher(day).accept_tokens(forged) < len(forged)


@pytest.mark.parametrize("name", sorted(REAL_SCHEMAS))
def test_qwen_real_schemas(name: str) -> None:
    compiler, vocab = real_compiler("qwen2"), real_vocabulary("qwen2").vocab
    check(compiler, vocab, REAL_SCHEMAS[name], walks=2, steps=30, seed=len(name), any_whitespace=False)


@pytest.mark.peers
@pytest.mark.parametrize("vocab_name", ["qwen2", "o200k_base", "mistral-spm-32k"])
@pytest.mark.parametrize("name", sorted(REAL_SCHEMAS))
@pytest.mark.parametrize("any_whitespace", [False, True])
def test_real_vocabularies(vocab_name: str, name: str, any_whitespace: bool) -> None:
    compiler, vocab = real_compiler(vocab_name), real_vocabulary(vocab_name).vocab
    check(compiler, vocab, REAL_SCHEMAS[name], walks=6, steps=60, seed=len(name), any_whitespace=any_whitespace)


def test_sentinel_lead_byte_is_refused_by_xgrammars_free_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """The entry test's premise, checked on the installed xgrammar as triemask checks it; the
    check would have refused the old lead byte, 0x01."""
    check_entry_unforgeable()
    monkeypatch.setattr(_structure, "SENTINEL_LEAD", 0x01)
    with pytest.raises(ImportError, match="lets free text"):
        check_entry_unforgeable.__wrapped__()
    monkeypatch.undo()
    # and a byte said to begin no character that free text begins one with: the C fills would
    # leave its refusal to xgrammar
    monkeypatch.setattr(_structure, "BEGIN_NO_CHARACTER", b"a\x80")
    with pytest.raises(ImportError, match="0x61, which begins no UTF-8 character"):
        check_entry_unforgeable.__wrapped__()
    monkeypatch.undo()
    table = [bytes([b]) for b in range(256)]
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo(table, xgr.VocabType.RAW, vocab_size=256, stop_token_ids=[]))
    for kind in (kind for kind in FREE.values() if kind["type"] == "string"):
        grammar = compiler.compile_json_schema(json.dumps({"type": "array", "items": kind}), any_whitespace=False)
        matcher = xgr.GrammarMatcher(grammar)
        assert matcher.accept_string(b'["')
        mask = np.zeros((1, 8), dtype=np.int32)
        matcher.fill_next_token_bitmask(mask)
        assert mask[0, 7] >= 0, "byte 0xFF allowed in free text"
    assert not strict_json_prefix(b'"\xff')


def test_separators_must_be_jsons(strict_vocab: Vocabulary, strict_compiler: Compiler) -> None:
    schema = object_of(["bounded", "enum"])
    with pytest.raises(SchemaError, match="not JSON's"):
        strict_compiler.compile_json_schema(schema, separators=(";", "="))
    with pytest.raises(ArgumentTypeError, match="pair of strings"):
        strict_compiler.compile_json_schema(schema, separators=(",",))  # type: ignore[arg-type]
    check(strict_compiler, strict_vocab, schema, walks=4, steps=30, seed=2, separators=(" , ", " :  "))


def test_finite_patterns_follow_the_pattern_where_xgrammar_misreads_it(strict_compiler: Compiler) -> None:
    """xgrammar 0.2.9 reads an optional group after a counted repetition wrongly (it takes
    ``"P781"`` for ``^[A-Z][0-9]{2}(\\.[0-9]{1,2})?$``); a finite pattern is triemask's automaton,
    which follows the pattern, so the output validates. (Found by the walks on real vocabularies;
    the walks' schemas avoid that construction, where the two engines' languages differ.)"""
    schema = {"type": "string", "pattern": "^[A-Z][0-9]{2}(\\.[0-9]{1,2})?$"}
    compiled = strict_compiler.compile_json_schema(schema, min_enum_values=2)
    assert compiled.stats()["trie_fields"]
    for text, valid in ((b'"P78"', True), (b'"P78.1"', True), (b'"P781"', False), (b'"P78."', False)):
        matcher = Matcher(compiled)
        assert (matcher.accept_tokens(text) == len(text) and matcher.value is not None) == valid, text
        if valid:
            jsonschema.validate(matcher.value, schema)


# ----------------------------------------------------------------------------- the audit


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "propertyNames": ENUM_KEYS, "additionalProperties": {"type": "integer"}},
        {  # pydantic's dict[SomeEnum, int]: the key schema by reference, here through a second one
            "$defs": {"Key": ENUM_KEYS, "Alias": {"$ref": "#/$defs/Key"}},
            "type": "object",
            "properties": {
                "v": {"$ref": "#/$defs/Key"},
                "m": {"type": "object", "propertyNames": {"$ref": "#/$defs/Alias"}, "additionalProperties": {}},
            },
            "required": ["v", "m"],
        },
    ],
)
def test_property_names_stay_xgrammars(strict_vocab: Vocabulary, strict_compiler: Compiler, schema: Any) -> None:
    """A sentinel stands for a value; an enum of keys (which a token may enter after ``{``
    and leave before ``:``) stays in the structure."""
    compiled = strict_compiler.compile_json_schema(schema, any_whitespace=False, min_enum_values=2)
    assert compiled.stats()["trie_fields"] == []
    reference = reference_compiler(strict_vocab).compile_json_schema(json.dumps(schema), any_whitespace=False)
    compare_walks(compiled, reference, strict_vocab, walks=10, steps=30, seed=4)


@pytest.mark.parametrize("kinds", [["bounded", "enum", "plain", "date"], ["enum", "plain", "date"]])
@pytest.mark.parametrize("padding", [0, 3, 200])
def test_extra_tokens_with_and_without_padding_ids(padding: int, kinds: list[str]) -> None:
    """The extra ``p + 0xFF`` tokens (``p + 0x01`` where no string admits a raw control: no
    length bound) go in the model's padding ids when they fit (200), else after the real ids,
    in a scratch row (none, or too few)."""
    table: list[bytes | None] = [bytes([b]) for b in range(256)] + STRICT_MERGES + [None]
    vocab = Vocabulary(table, eos_token_ids=[len(table) - 1], vocab_size=len(table) + padding)
    check(Compiler(vocab), vocab, object_of(kinds), walks=6, steps=40, seed=padding)


def test_sentinels_in_the_grammar_text_parse_as_in_the_parsed_grammar() -> None:
    """``sentinel_ebnf`` (0x01 sentinels written into xgrammar's EBNF text, which its cached
    compiler parses) gives the grammar ``structure_grammar`` writes into the parsed one; a
    placeholder found elsewhere than as its own literal is none."""
    placeholders = ["tm-0f3a-0", "tm-0f3a-1"]
    schema = {
        "type": "object",
        "properties": {"a": {"const": placeholders[0]}, "b": {"type": "array", "items": {"const": placeholders[1]}}},
        "required": ["a", "b"],
    }
    ebnf = str(xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False))
    sentinels = {
        p: _structure.field_sentinel(k, 1, _structure.CONTROL_SENTINEL_LEAD) for k, p in enumerate(placeholders)
    }
    text = _structure.sentinel_ebnf(ebnf, sentinels)
    assert text is not None and placeholders[0] not in text
    parsed = json.loads(xgr.Grammar.from_ebnf(text).serialize_json())
    assert parsed == json.loads(_structure.structure_grammar(ebnf, sentinels).serialize_json())
    assert _structure.sentinel_ebnf(ebnf + f"\nx ::= [{placeholders[0]}]", sentinels) is None
