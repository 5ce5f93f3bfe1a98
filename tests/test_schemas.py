"""Mixed schemas: enum fields in tries, structure in xgrammar, checked against xgrammar's
language for the whole schema.

The oracle is xgrammar compiling the *original* schema (enums included) with the same
options. xgrammar's bitmask sometimes omits tokens its own ``accept_token`` takes
(issue 11 reproduces one), so every token where the two masks differ is judged by
``accept_token`` on a fork of xgrammar's matcher: triemask must allow exactly the
tokens the whole schema's language continues with.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import threading
import warnings
import zlib
from collections import Counter
from typing import Any, Literal

import jsonschema
import numpy as np
import pytest
from benchmarks.schemas import vllm_required_schema  # (vLLM 0.32's builder, reproduced there)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import byte_vocabulary, real_compiler, real_vocabulary
from oracle import strict_json_prefix
from triemask import (
    ArgumentTypeError,
    CompiledSchema,
    CompiledTools,
    Compiler,
    Matcher,
    SchemaError,
    SchemaMatcher,
    StateError,
    UnenforcedSchemaWarning,
    Vocabulary,
    fill_next_token_bitmasks,
)
from triemask.datasets import load_tool_registry, tool_specs
from triemask.schemas import clear_structure_cache, dispatch, prepare_schemas
from triemask.schemas import compiled as compiled_module
from triemask.schemas import support as support_module
from triemask.schemas.engine import SchemaEngine
from triemask.schemas.reading import _without_annotations_reference, structure_text, without_annotations
from triemask.schemas.support import compile_threads, vocabulary_support

xgr = pytest.importorskip("xgrammar")

# Values that stress the JSON spelling and the trie: quotes, backslashes, control
# characters, DEL, non-ASCII, values that are prefixes of others, an empty string.
NAMES = [
    "get_user",
    "get_users",
    "get",
    "a",
    "ab",
    "abc",
    "x",
    'say "hi"',
    "back\\slash",
    "tab\there",
    "ctl\x01\x7f",
    "é",
    "日本",
    "emoji 😀",
    "",
    "a, b",
    "}",
]
NUMBERS = [1, 12, 2.5, -3, 1e20, True, False, None, 0]

MERGES = [
    b'": "',
    b'":"',
    b'"a',
    b'",',
    b'", "',
    b'"}',
    b'"]',
    b'"],',
    b"get",
    b"_user",
    b'er"',
    b'er",',
    b'"get',
    b': "',
    b'{"',
    b"name",
    b'"name',
    b"1,",
    b", 1",
    b"12",
    b"true",
    b"null",
    b'"x"',
    b'"x",',
    b'"x", "',
    b"ab",
    b'"ab"}',
    b' "',
    b'"c',
    b'\\"',
    b"\\\\",
    b'hi\\"',
    b'["',
    b'{"name": "get',
    b'"}, {"',
    b'\xc3\xa9"',
    b'": 1',
    b"2.5,",
]

SCHEMAS: dict[str, dict[str, Any]] = {
    "enum first": {
        "type": "object",
        "properties": {"name": {"enum": NAMES}, "count": {"type": "integer"}},
        "required": ["name", "count"],
    },
    "enum last, optional": {
        "type": "object",
        "properties": {"note": {"type": "string"}, "name": {"enum": NAMES}},
        "required": ["note"],
    },
    "adjacent enums": {
        "type": "object",
        "properties": {"a": {"enum": NAMES}, "b": {"enum": NAMES[:9]}, "n": {"enum": NUMBERS}},
        "required": ["a", "b", "n"],
    },
    "array and nested": {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"enum": NAMES}},
            "inner": {"type": "object", "properties": {"kind": {"anyOf": [{"const": v} for v in NAMES[:8]]}}},
        },
        "required": ["tags", "inner"],
    },
    "$ref": {
        "$defs": {"Name": {"type": "string", "enum": NAMES}},
        "type": "object",
        "properties": {"first": {"$ref": "#/$defs/Name"}, "rest": {"type": "array", "items": {"$ref": "#/$defs/Name"}}},
        "required": ["first", "rest"],
    },
    "union with a free string": {
        "type": "object",
        "properties": {"v": {"anyOf": [{"enum": NAMES}, {"type": "string"}, {"type": "null"}]}},
        "required": ["v"],
    },
    "bare enum": {"enum": NAMES + NUMBERS},
    "formats and patterns": {
        "type": "object",
        "properties": {
            "day": {"type": "string", "format": "date"},
            "id": {"type": "string", "format": "uuid", "description": "annotations do not matter"},
            "ip": {"type": "string", "format": "ipv4"},
            "code": {"type": "string", "pattern": "^[A-Ca-c][0-9]{1,2}(x|é)?$"},
            "name": {"enum": NAMES},
            "at": {"type": "string", "format": "time"},
        },
        "required": ["day", "id", "ip", "code", "name", "at"],
    },
    "format in a union": {
        "type": "array",
        "items": {"anyOf": [{"type": "string", "format": "date"}, {"type": "string"}, {"type": "integer"}]},
    },
}


def reference_compiler(vocab: Vocabulary) -> Any:
    encoded = [vocab.token_bytes(i) or b"" for i in range(len(vocab))]
    encoded += [b""] * (vocab.vocab_size - len(encoded))
    info = xgr.TokenizerInfo(
        encoded, xgr.VocabType.RAW, vocab_size=vocab.vocab_size, stop_token_ids=list(vocab.eos_token_ids)
    )
    return xgr.GrammarCompiler(info, cache_enabled=False)


def unpack(row: np.ndarray, vocab_size: int) -> set[int]:
    bits = np.unpackbits(row.reshape(-1).view(np.uint8), bitorder="little")[:vocab_size]
    return set(np.flatnonzero(bits).tolist())


def _unsettled(data: bytes | None) -> bool:
    """Tokens whose strictness is checked even where both engines allow them: they hold a
    control byte or are not UTF-8 on their own (a surrogate's bytes, 0xFF, a split character)."""
    if data is None:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return min(data) < 0x20


def compare_walks(
    compiled: CompiledSchema,
    reference: Any,
    vocab: Vocabulary,
    *,
    walks: int,
    steps: int,
    seed: int,
    schema: Any = None,
    tally: Counter[str] | None = None,
) -> int:
    """Random walks through ``compiled``, every mask judged by the whole schema's language;
    returns how many steps were compared.

    A token is allowed iff xgrammar's matcher for the whole schema accepts it (on a fork:
    its bitmask sometimes omits tokens its ``accept_token`` takes) and the output stays strict
    JSON (:func:`oracle.strict_json_prefix`: xgrammar is looser inside length-bounded strings).
    Every completed output parses with strict ``json.loads`` and validates against ``schema``
    (default: the compiled schema) with ``jsonschema``. ``tally`` counts what was checked.
    """
    tally = Counter() if tally is None else tally
    validator = jsonschema.Draft202012Validator(compiled.schema if schema is None else schema)
    rng = random.Random(seed)
    v = vocab.vocab_size
    width = (v + 31) // 32
    eos = set(vocab.eos_token_ids)
    unsettled = {t for t in range(len(vocab)) if _unsettled(vocab.token_bytes(t))}
    compared = 0

    def judged(ours: SchemaMatcher, theirs: Any, token: int) -> bool:
        data = vocab.token_bytes(token)
        return (data is None or strict_json_prefix(ours.text + data)) and theirs.fork().accept_token(token)

    for _ in range(walks):
        ours = Matcher(compiled)
        assert isinstance(ours, SchemaMatcher)
        theirs = xgr.GrammarMatcher(reference)
        for _ in range(steps):
            allowed = set(ours.allowed_token_ids().tolist())
            row = np.zeros((1, width), dtype=np.int32)
            theirs.fill_next_token_bitmask(row)
            theirs_allowed = unpack(row, v)
            differing = allowed ^ theirs_allowed
            for token in differing | (allowed & unsettled):
                verdict = judged(ours, theirs, token)
                assert (token in allowed) == verdict, (ours.text, token, vocab.token_bytes(token), token in allowed)
            assert all(vocab.token_bytes(t) or t in eos for t in allowed), "a special token was allowed"
            compared += 1
            tally["steps"] += 1
            tally["allowed"] += len(allowed)
            tally["judged"] += len(differing | (allowed & unsettled))
            for token in theirs_allowed - allowed:  # why the judge refused what xgrammar's mask has
                data = vocab.token_bytes(token)
                strict = data is None or strict_json_prefix(ours.text + data)
                tally["in xgrammar's mask, " + ("refused by its accept_token" if strict else "not strict JSON")] += 1
            for token in rng.sample(range(v), 24):  # tokens outside triemask's mask
                if token not in allowed:
                    language = judged(ours, theirs, token)
                    accepted = ours.accept_token(token)
                    if accepted:
                        ours.rollback(1)
                    assert language or not accepted, (ours.text, token, vocab.token_bytes(token))
                    # what the language takes and the mask omits, xgrammar's own mask omits (its known
                    # gap: its accept_token takes tokens its bitmask leaves out)
                    assert not language or token not in theirs_allowed, (ours.text, token, vocab.token_bytes(token))
                    tally["sampled outside the mask"] += 1
                    tally["taken by xgrammar's accept_token, not its mask"] += language
            if not allowed:
                break
            # biased to the tokens that cross boundaries (quotes) or test strictness (control bytes,
            # partial UTF-8), not so much that whitespace drowns the walk
            quoted = [t for t in allowed if b'"' in (vocab.token_bytes(t) or b"")]
            strict = [t for t in allowed if t in unsettled]
            draw = rng.random()
            pool = quoted if quoted and draw < 0.45 else strict if strict and draw < 0.65 else allowed
            token = rng.choice(sorted(pool))
            assert ours.accept_token(token)
            assert theirs.accept_token(token)
            if ours.is_terminated():
                break
        tally["walks"] += 1
        if theirs.is_completed():
            value = json.loads(ours.text.decode("utf-8"))  # strict: no raw control character
            assert ours.value == value
            validator.validate(value)
            tally["completed, strict JSON, valid"] += 1
    return compared


@pytest.fixture(scope="module")
def byte_vocab() -> Vocabulary:
    return byte_vocabulary(MERGES)


@pytest.fixture(scope="module")
def byte_compiler(byte_vocab: Vocabulary) -> Compiler:
    return Compiler(byte_vocab)


def test_prepare_schemas_builds_the_pieces_of_string_enums(monkeypatch: pytest.MonkeyPatch) -> None:
    """After prepare_schemas, the first schema with an enum of strings builds no token pieces
    (a server's first request does not pay for them)."""
    vocab = byte_vocabulary([b'"a', b'a"', b"ab"])  # (a vocabulary no other test prepared)
    prepare_schemas(vocab)
    built: list[tuple[bytes, bytes]] = []
    original = support_module.Pieces.__init__

    def counted(self: Any, support: Any, first: bytes, last: bytes) -> None:
        built.append((first, last))
        original(self, support, first, last)

    monkeypatch.setattr(support_module.Pieces, "__init__", counted)
    Compiler(vocab).compile_json_schema({"enum": ["a", "ab", "b"]}, min_enum_values=1)
    assert built == []
    Compiler(vocab).compile_json_schema({"enum": [1, 2, 3]}, min_enum_values=1)
    assert built == [(b"123", b"123")]


@pytest.mark.parametrize("any_whitespace", [False, True])
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_masks_equal_the_whole_schema(
    byte_vocab: Vocabulary, byte_compiler: Compiler, name: str, any_whitespace: bool
) -> None:
    schema = SCHEMAS[name]
    compiled = byte_compiler.compile_json_schema(schema, any_whitespace=any_whitespace, min_enum_values=2)
    assert compiled.stats()["trie_fields"], "the enums went to tries"
    reference = reference_compiler(byte_vocab).compile_json_schema(json.dumps(schema), any_whitespace=any_whitespace)
    assert compare_walks(compiled, reference, byte_vocab, walks=12, steps=50, seed=zlib.crc32(name.encode())) > 36


def test_finite_string_fields_go_to_automata_where_the_language_is_xgrammars(byte_compiler: Compiler) -> None:
    properties = {
        "date": {"type": "string", "format": "date"},
        "ipv6": {"type": "string", "format": "ipv6"},
        "pattern": {"type": "string", "pattern": "[a-f]{2,3}-[0-9]"},
        # not dispatched: infinite (time's fraction, *), escapes needed (".", a quote),
        # other constraints xgrammar would drop, or no string type
        "time": {"type": "string", "format": "time"},
        "date-time": {"type": "string", "format": "date-time"},
        "email": {"type": "string", "format": "email"},
        "star": {"type": "string", "pattern": "a*"},
        "dot": {"type": "string", "pattern": "a.b"},
        "quote": {"type": "string", "pattern": 'a"b'},
        "bounded": {"type": "string", "format": "date", "maxLength": 12},
        "both": {"type": "string", "format": "date", "pattern": "[0-9]{4}"},
        "untyped": {"format": "date"},
    }
    compiled = byte_compiler.compile_json_schema({"type": "object", "properties": properties}, min_enum_values=2)
    paths = [f["paths"] for f in compiled.stats()["trie_fields"]]
    assert paths == [["$.properties.date.format"], ["$.properties.ipv6.format"], ["$.properties.pattern.pattern"]]
    assert compiled.stats()["trie_fields"][2]["values"] == 6**2 * 10 + 6**3 * 10


def test_separators_and_indent(byte_vocab: Vocabulary, byte_compiler: Compiler) -> None:
    schema = SCHEMAS["adjacent enums"]
    for options in ({"indent": 2}, {"separators": (",", ":")}, {"strict_mode": False, "any_whitespace": False}):
        compiled = byte_compiler.compile_json_schema(schema, min_enum_values=2, **options)
        reference = reference_compiler(byte_vocab).compile_json_schema(json.dumps(schema), **options)
        compare_walks(compiled, reference, byte_vocab, walks=6, steps=40, seed=3)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
        },
    },
    {
        "name": "get_user",
        "description": "one",
        "parameters": {
            "type": "object",
            "properties": {"kind": {"enum": NAMES}, "q": {"type": "string"}},
            "required": ["kind"],
        },
    },
    {
        "name": "get_users",
        "parameters": {
            "type": "object",
            "properties": {"kind": {"enum": NAMES}, "q": {"type": "string"}},
            "required": ["kind"],
        },
    },
    {"name": "x", "parameters": {"type": "object", "properties": {}}},
    {
        "name": 'say "hi"',
        "parameters": {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": NAMES[:5]}}}},
    },
    {"name": "é"},
]


def tools_as_any_of(tools: list[dict[str, Any]]) -> dict[str, Any]:
    specs = [tool.get("function", tool) for tool in tools]
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "name": {"const": s["name"]},
                    "arguments": s.get("parameters", {"type": "object", "properties": {}}),
                },
                "required": ["name", "arguments"],
            }
            for s in specs
        ]
    }


@pytest.mark.parametrize("any_whitespace", [False, True])
def test_tools_equal_the_any_of(byte_vocab: Vocabulary, byte_compiler: Compiler, any_whitespace: bool) -> None:
    compiled = byte_compiler.compile_tools(TOOLS, any_whitespace=any_whitespace, min_enum_values=2)
    assert isinstance(compiled, CompiledTools)
    reference = reference_compiler(byte_vocab).compile_json_schema(
        json.dumps(tools_as_any_of(TOOLS)), any_whitespace=any_whitespace
    )
    compare_walks(compiled, reference, byte_vocab, walks=30, steps=50, seed=7, schema=tools_as_any_of(TOOLS))
    stats = compiled.stats()["tools"]
    assert stats["count"] == len(TOOLS)
    assert stats["misses"] <= len(TOOLS) - 1  # get_user and get_users share one compiled schema


def test_tool_arguments_compiled_once_and_bounded(byte_compiler: Compiler) -> None:
    compiled = byte_compiler.compile_tools(TOOLS, cache_bytes=1)
    compiled.warm()
    stats = compiled.stats()["tools"]
    assert stats["argument_schemas_cached"] == 0  # every schema is larger than one byte: none kept
    roomy = byte_compiler.compile_tools(TOOLS)
    threads = [threading.Thread(target=roomy.warm) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = roomy.stats()["tools"]
    distinct = {json.dumps(t.get("function", t).get("parameters", {"type": "object", "properties": {}})) for t in TOOLS}
    assert stats["misses"] == len(distinct) == 4  # equal parameters compile once, even from four threads
    assert roomy.arguments_schema("get_user") is roomy.arguments_schema("get_users")


def test_matcher_interface(byte_vocab: Vocabulary, byte_compiler: Compiler) -> None:
    compiled = byte_compiler.compile_json_schema(SCHEMAS["enum first"], any_whitespace=False, min_enum_values=2)
    text = b'{"name": "get_users", "count": 12}'
    ids = {byte_vocab.token_bytes(i): i for i in range(len(byte_vocab)) if byte_vocab.token_bytes(i)}
    tokens = [
        ids[b'{"name": "get'],
        ids[b"_user"],
        ids[b"s"],
        ids[b'",'],
        ids[b" "],
        ids[b'"'],
        *(ids[bytes([c])] for c in b'count": 12}'),
    ]
    assert b"".join(byte_vocab.token_bytes(t) or b"" for t in tokens) == text
    matcher = Matcher(compiled, max_rollback=64)
    masks = []
    inside = []
    for token in tokens:
        inside.append(matcher.in_enum_value)
        masks.append(matcher.allowed_token_ids().tolist())
        assert matcher.accept_token(token)
    assert inside[:4] == [False, True, True, True] and not any(inside[4:])  # inside "get_users" only
    assert matcher.value == {"name": "get_users", "count": 12} and not matcher.in_enum_value
    eos = byte_vocab.eos_token_ids[0]
    assert eos in matcher.allowed_token_ids()
    copy = matcher.copy()
    assert matcher.accept_token(eos) and matcher.is_terminated()
    assert not copy.is_terminated() and copy.value == {"name": "get_users", "count": 12}
    matcher.rollback(1)
    for back in range(len(tokens), 0, -1):  # rollback restores every earlier mask
        matcher.rollback(1)
        assert matcher.allowed_token_ids().tolist() == masks[back - 1]
    assert matcher.text == b"" and matcher.value is None
    assert matcher.accept_tokens(tokens) == len(tokens)
    matcher.reset()
    assert matcher.text == b"" and matcher.allowed_token_ids().tolist() == masks[0]
    with pytest.raises(StateError):
        matcher.rollback(1)
    assert not matcher.accept_token(-1) and not matcher.accept_token(10**9) and not matcher.accept_token(1.5)  # type: ignore[arg-type]


def test_accepting_without_filling_follows_every_reading(byte_vocab: Vocabulary, byte_compiler: Compiler) -> None:
    """accept_token must not rely on a mask filled for an earlier state (tokens accepted
    back to back, as when a prompt's forced tokens are replayed)."""
    compiled = byte_compiler.compile_json_schema(SCHEMAS["enum first"], any_whitespace=False, min_enum_values=2)
    ids = {byte_vocab.token_bytes(i): i for i in range(len(byte_vocab)) if byte_vocab.token_bytes(i)}
    matcher = Matcher(compiled)
    matcher.fill_next_token_bitmask(np.zeros((1, (byte_vocab.vocab_size + 31) // 32), dtype=np.int32))
    assert matcher.accept_tokens([ids[b'{"'], *(ids[bytes([c])] for c in b'name"'), ids[b': "'], ids[b"get"]]) == 8
    assert matcher.text == b'{"name": "get'


def test_copies_are_independent_and_matchers_say_why_not_pickled(
    byte_vocab: Vocabulary, byte_compiler: Compiler
) -> None:
    import copy
    import pickle

    compiled = byte_compiler.compile_json_schema(SCHEMAS["enum first"], min_enum_values=2)
    matcher = Matcher(compiled)
    matcher.accept_tokens([ord("{"), ord('"')])
    for clone in (copy.copy(matcher), copy.deepcopy(matcher), matcher.copy()):
        assert clone.text == matcher.text and clone.accept_token(ord("n"))
        assert matcher.text == b'{"'  # the original did not move
        clone.rollback(3)
        assert clone.text == b"" and matcher.text == b'{"'
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(matcher)  # it holds xgrammar matchers; the compiled schema pickles (see test_schema_files)


def test_batch_fill(byte_vocab: Vocabulary, byte_compiler: Compiler) -> None:
    compiled = byte_compiler.compile_json_schema(SCHEMAS["adjacent enums"], min_enum_values=2)
    matchers = [Matcher(compiled) for _ in range(3)]
    matchers[1].accept_tokens([ord("{"), ord('"'), ord("a")])
    matchers[2].accept_tokens([ord("{")])
    bitmask = np.full((5, (byte_vocab.vocab_size + 31) // 32), -1, dtype=np.int32)
    fill_next_token_bitmasks(matchers, bitmask, rows=[4, 0, 2])
    for matcher, row in zip(matchers, [4, 0, 2], strict=True):
        assert unpack(bitmask[row], byte_vocab.vocab_size) == set(matcher.allowed_token_ids().tolist())
    assert (bitmask[[1, 3]] == -1).all()
    with pytest.raises(StateError, match="rows"):
        fill_next_token_bitmasks(matchers, bitmask, rows=[0, 1])
    with pytest.raises(ArgumentTypeError):
        fill_next_token_bitmasks([object()], bitmask)  # type: ignore[list-item]


def test_stats_and_sharing(byte_compiler: Compiler) -> None:
    compiled = byte_compiler.compile_json_schema(SCHEMAS["$ref"], min_enum_values=2)
    stats = compiled.stats()
    (field,) = stats["trie_fields"]  # one trie for the enum the $ref names, wherever it is used
    assert field["values"] == len(NAMES) and field["paths"] == ["$.$defs.Name.enum"]
    assert stats["structure"]["engine"] == "xgrammar" and compiled.memory_bytes > field["memory_bytes"]
    small = byte_compiler.compile_json_schema(SCHEMAS["$ref"])  # 17 values: below the default threshold
    assert small.stats()["trie_fields"] == []
    assert compiled.schema == SCHEMAS["$ref"]


def test_xgrammar_compiles_on_no_more_than_two_threads_per_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """xgrammar's default (8) where the process may use four CPUs or more, else two per CPU."""
    for cpus, threads in [(range(64), 8), (range(4), 8), (range(3), 6), (range(2), 4), (range(1), 2)]:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, cpus=cpus: set(cpus), raising=False)
        assert compile_threads() == threads
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # (macOS, Windows)
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert compile_threads() == 2


def test_pydantic_models(byte_vocab: Vocabulary, byte_compiler: Compiler) -> None:
    pydantic = pytest.importorskip("pydantic")
    from typing import Literal

    Kind = Literal["get_user", "get_users", "get", "a", "ab"]

    class Call(pydantic.BaseModel):  # type: ignore[misc, name-defined]
        kind: Kind  # type: ignore[valid-type]
        other: Kind | None = None  # type: ignore[valid-type]
        count: int

    compiled = byte_compiler.compile_json_schema(Call, any_whitespace=False, min_enum_values=2)
    assert len(compiled.stats()["trie_fields"]) == 1
    reference = reference_compiler(byte_vocab).compile_json_schema(Call, any_whitespace=False)
    compare_walks(compiled, reference, byte_vocab, walks=8, steps=40, seed=11)


def test_bad_schemas_name_the_field(byte_compiler: Compiler) -> None:
    with pytest.raises(SchemaError, match="not valid JSON") as info:
        byte_compiler.compile_json_schema('{"type": ')
    assert info.value.path == "$"
    with pytest.raises(SchemaError, match="object"):
        byte_compiler.compile_json_schema("[1, 2]")
    with pytest.raises(ArgumentTypeError):
        byte_compiler.compile_json_schema(42)
    empty = {"type": "object", "properties": {"name": {"enum": []}}}
    with pytest.raises(SchemaError, match="empty") as info:
        byte_compiler.compile_json_schema(empty)
    assert info.value.path == "$.properties.name.enum"
    surrogate = {"type": "object", "properties": {"name": {"enum": ["a", "b", "c", "\ud800"]}}}
    with pytest.raises(SchemaError) as info:
        byte_compiler.compile_json_schema(surrogate, min_enum_values=2)
    assert info.value.path == "$.properties.name.enum[3]"
    with pytest.raises(SchemaError, match="xgrammar"):
        byte_compiler.compile_json_schema({"type": "object", "properties": {"a": {"type": "no-such-type"}}})
    for keyword, value in (("uniqueItems", True), ("not", {"const": 1}), ("contains", {"const": 5})):
        unenforced = {"type": "object", "properties": {"tags": {"type": "array", keyword: value}}}
        with pytest.raises(SchemaError, match="does not enforce") as info:
            byte_compiler.compile_json_schema(unenforced, unsupported="error")
        assert info.value.path == f"$.properties.tags.{keyword}"
    with pytest.raises(SchemaError, match="unsupported must be one of"):
        byte_compiler.compile_json_schema({"type": "string"}, unsupported="loud")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a no-op is no warning
        byte_compiler.compile_json_schema({"type": "array", "uniqueItems": False}, unsupported="error")
    with pytest.raises(SchemaError, match="Cannot find field"):
        byte_compiler.compile_json_schema({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}})
    with pytest.raises(SchemaError, match="nested too deeply"):
        byte_compiler.compile_json_schema('{"a":' * 5_000 + "1" + "}" * 5_000)
    with pytest.raises(SchemaError, match="min_enum_values"):
        byte_compiler.compile_json_schema({"type": "string"}, min_enum_values=0)


def test_unspellable_enum_value_names_its_index() -> None:
    table: list[bytes | None] = [bytes([b]) for b in range(256) if b != ord("z")] + [None]
    compiler = Compiler(Vocabulary(table, eos_token_ids=len(table) - 1))
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b", "zz", "c"]}}}}
    with pytest.raises(SchemaError, match="cannot be spelled") as info:
        compiler.compile_json_schema(schema, min_enum_values=2)
    assert info.value.path == "$.properties.tags.items.enum[2]"


def test_unspellable_tool_name_names_the_tool() -> None:
    table: list[bytes | None] = [bytes([b]) for b in range(256) if b != ord("z")] + [None]
    compiler = Compiler(Vocabulary(table, eos_token_ids=len(table) - 1))
    with pytest.raises(SchemaError, match="cannot be spelled") as info:
        compiler.compile_tools([{"name": "get"}, {"name": "zap"}])
    assert info.value.path == "$[1].name"
    tools = compiler.compile_tools([{"name": "get"}])
    with pytest.raises(SchemaError, match="outside"):
        tools.arguments_schema(3)
    with pytest.raises(SchemaError, match="no tool is named"):
        tools.arguments_schema("put")


def test_bad_tool_lists_name_the_field(byte_compiler: Compiler) -> None:
    with pytest.raises(SchemaError, match="distinct") as info:
        byte_compiler.compile_tools([{"name": "a"}, {"type": "function", "function": {"name": "a"}}])
    assert info.value.path == "$[1].function.name"
    with pytest.raises(SchemaError, match="empty"):
        byte_compiler.compile_tools([])
    with pytest.raises(SchemaError) as info:
        byte_compiler.compile_tools([{"name": "a"}, {"description": "no name"}])
    assert info.value.path == "$[1].name"
    with pytest.raises(SchemaError) as info:
        byte_compiler.compile_tools([{"name": "a", "parameters": "object"}])
    assert info.value.path == "$[0].parameters"
    with pytest.raises(ArgumentTypeError):
        byte_compiler.compile_tools({"name": "a"})
    broken = byte_compiler.compile_tools(
        [{"name": "a", "parameters": {"type": "object", "properties": {"k": {"enum": []}}}}]
    )
    with pytest.raises(SchemaError) as info:  # a tool's parameters are checked when it is compiled
        broken.warm()
    assert info.value.path == "$[0].parameters.properties.k.enum"


def test_json_texts_match_xgrammar() -> None:
    """Enum values are spelled exactly as xgrammar spells them (numbers reformatted)."""
    from triemask.schemas.reading import json_texts

    values = ("a/b", 'q"x', "b\\s", "nl\n\t\x01\x1f\x7f", "é😀", 1, 1.0, 2.5, 1e20, -0.0, True, None, 0.1, 1e-7, 2**70)
    texts = json_texts(values, "$")
    table: list[bytes | None] = [bytes([b]) for b in range(256)] + [None]
    reference = reference_compiler(Vocabulary(table, eos_token_ids=256)).compile_json_schema(
        json.dumps({"enum": list(values)})
    )
    for text in texts:
        matcher = xgr.GrammarMatcher(reference)
        assert matcher.accept_string(text) and matcher.is_completed(), text


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(st.sampled_from('ab"\\\x00\x01\x1f\x7f\x80é😀 ')) | st.text(), min_size=1, max_size=8))
def test_json_texts_of_strings_escape_exactly(values: list[str]) -> None:
    """Strings take a fast path when none needs an escape: the texts are those of each value
    spelled alone (json.dumps with raw UTF-8, DEL as xgrammar escapes it)."""
    from triemask.schemas.reading import json_texts

    expected = [json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f").encode() for v in values]
    assert json_texts(tuple(values), "$") == expected


@pytest.mark.parametrize("any_whitespace", [False, True])
def test_qwen_tool_call(any_whitespace: bool) -> None:
    """The fast real-vocabulary check of `make test`: a tool-call schema on Qwen 151K."""
    name = "qwen2"
    compiler, vocab = real_compiler(name), real_vocabulary(name).vocab
    schema = {
        "type": "object",
        "properties": {
            "name": {
                "enum": [
                    f"{verb}_{noun}"
                    for verb in ("get", "set", "list", "get_all")
                    for noun in ("user", "users", "order", 'say "hi"')
                ]
            },
            "arguments": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "units": {"enum": ["metric", "imperial", "si"]}},
                "required": ["city"],
            },
        },
        "required": ["name", "arguments"],
    }
    compiled = compiler.compile_json_schema(schema, any_whitespace=any_whitespace, min_enum_values=2)
    reference = reference_compiler(vocab).compile_json_schema(json.dumps(schema), any_whitespace=any_whitespace)
    compare_walks(compiled, reference, vocab, walks=3, steps=30, seed=1)


@pytest.mark.peers
@pytest.mark.parametrize("name", ["qwen2", "o200k_base", "mistral-spm-32k"])
@pytest.mark.parametrize("schema_name", sorted(SCHEMAS))
def test_real_vocabularies(name: str, schema_name: str) -> None:
    compiler, vocab = real_compiler(name), real_vocabulary(name).vocab
    schema = SCHEMAS[schema_name]
    for any_whitespace in (False, True):
        compiled = compiler.compile_json_schema(schema, any_whitespace=any_whitespace, min_enum_values=2)
        reference = reference_compiler(vocab).compile_json_schema(json.dumps(schema), any_whitespace=any_whitespace)
        compare_walks(compiled, reference, vocab, walks=6, steps=40, seed=5)


@pytest.mark.peers
@pytest.mark.parametrize("name", ["qwen2", "o200k_base", "mistral-spm-32k"])
def test_real_vocabularies_tools(name: str) -> None:
    compiler, vocab = real_compiler(name), real_vocabulary(name).vocab
    for any_whitespace in (False, True):
        compiled = compiler.compile_tools(TOOLS, any_whitespace=any_whitespace, min_enum_values=2)
        reference = reference_compiler(vocab).compile_json_schema(
            json.dumps(tools_as_any_of(TOOLS)), any_whitespace=any_whitespace
        )
        compare_walks(compiled, reference, vocab, walks=8, steps=40, seed=9, schema=tools_as_any_of(TOOLS))


# ----------------------------------------------------------------------------- properties

_FRAGMENTS = [b'"', b'",', b'", "', b'": "', b'":', b'"}', b'"]', b"{", b"}", b"[", b"]", b", ", b": ", b" "]
_ALPHABET = 'ab"\\é ,}:'


def glued_tokens(glue: list[bytes], alphabet: str, max_size: int) -> st.SearchStrategy[list[bytes]]:
    """Distinct multi-byte tokens: a fragment of JSON (or nothing), value text, a fragment."""
    return st.lists(
        st.builds(
            lambda a, b, c: a + b + c,
            st.sampled_from([b"", *glue]),
            st.text(alphabet=alphabet, max_size=3).map(str.encode),
            st.sampled_from([b"", *glue]),
        ).filter(lambda t: len(t) > 1),
        max_size=max_size,
        unique=True,
    )


@settings(
    max_examples=int(os.environ.get("TRIEMASK_SCHEMA_EXAMPLES", "20")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(
    values=st.lists(st.text(alphabet=_ALPHABET, max_size=4), min_size=2, max_size=8, unique=True),
    numbers=st.lists(st.integers(-20, 20), max_size=3, unique=True),
    merges=glued_tokens(_FRAGMENTS, _ALPHABET, 25),
    shape=st.sampled_from(["property", "array", "two fields", "union"]),
    any_whitespace=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_random_enums_and_vocabularies_equal_the_whole_schema(
    values: list[str], numbers: list[int], merges: list[bytes], shape: str, any_whitespace: bool, seed: int
) -> None:
    """Random enum values (quotes, backslashes, separators, prefixes of each other), random
    vocabularies of JSON-ish fragments glued to value bytes, a few schema shapes."""
    enum = {"enum": [*values, *numbers]}
    schema = {
        "property": {"type": "object", "properties": {"v": enum, "n": {"type": "integer"}}, "required": ["v"]},
        "array": {"type": "array", "items": enum, "maxItems": 3},
        "two fields": {"type": "object", "properties": {"a": enum, "b": enum}, "required": ["a", "b"]},
        "union": {"type": "object", "properties": {"v": {"anyOf": [enum, {"type": "string"}]}}, "required": ["v"]},
    }[shape]
    vocab = byte_vocabulary([m for m in merges if len(m) > 1])
    compiled = Compiler(vocab).compile_json_schema(schema, any_whitespace=any_whitespace, min_enum_values=2)
    reference = reference_compiler(vocab).compile_json_schema(json.dumps(schema), any_whitespace=any_whitespace)
    compare_walks(compiled, reference, vocab, walks=4, steps=30, seed=seed)


def test_schemas_of_one_skeleton_share_their_structure(
    byte_vocab: Vocabulary, byte_compiler: Compiler, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """Schemas that differ only in their enum values (labels per tenant) compile the structure
    once: the second takes the first's grammar, and its masks are its own language's."""

    def labelled(labels: list[str], scores: list[int]) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {
                "label": {"enum": labels},
                "note": {"type": "string", "maxLength": 8},
                "score": {"enum": scores},
                "again": {"enum": labels},
            },
            "required": ["label", "score"],
        }

    first = byte_compiler.compile_json_schema(labelled(NAMES[:6], [1, 2, 3]), min_enum_values=2)
    schema = labelled(NAMES[6:14], [7, 8])
    second = byte_compiler.compile_json_schema(schema, min_enum_values=2)
    assert second.stats()["structure"]["shared"] and second._grammar is first._grammar
    assert [f["values"] for f in second.stats()["trie_fields"]] == [8, 2]  # "again" shares "label"'s trie
    other = byte_compiler.compile_json_schema(labelled(NAMES[:3], [1, 1, 2]), min_enum_values=2)  # 1 is a dedupe
    assert other.stats()["structure"]["shared"]
    differently_shared = {"type": "object", "properties": {"label": {"enum": NAMES[:4]}, "again": {"enum": NAMES[4:8]}}}
    one = byte_compiler.compile_json_schema(differently_shared, min_enum_values=2)
    differently_shared["properties"]["again"]["enum"] = NAMES[:4]  # the same values: one trie for both sites
    two = byte_compiler.compile_json_schema(differently_shared, min_enum_values=2)
    assert not two.stats()["structure"]["shared"] and len(one.stats()["trie_fields"]) == 2 != len(
        two.stats()["trie_fields"]
    )
    reference = reference_compiler(byte_vocab).compile_json_schema(json.dumps(schema))
    assert compare_walks(second, reference, byte_vocab, walks=8, steps=40, seed=3) > 24
    second.save(tmp_path / "second.triemask")
    loaded = CompiledSchema.load(tmp_path / "second.triemask", vocab=byte_vocab)
    assert not loaded.stats()["structure"]["shared"]
    assert compare_walks(loaded, reference, byte_vocab, walks=4, steps=40, seed=4) > 12


def test_a_schema_text_never_poses_as_another_skeleton(byte_vocab: Vocabulary, byte_compiler: Compiler) -> None:
    """Two structures whose texts differ only where one holds a placeholder and the other a
    string that looks like one are two skeletons: each keeps its own language."""
    for stand_in in ("triemask-skeleton-0", "triemask-0"):
        enum_first = {"type": "object", "properties": {"x": {"enum": NAMES[:4]}, "y": {"const": stand_in}}}
        const_first = {"type": "object", "properties": {"x": {"const": stand_in}, "y": {"enum": NAMES[:4]}}}
        byte_compiler.compile_json_schema(enum_first, min_enum_values=2, any_whitespace=False)
        compiled = byte_compiler.compile_json_schema(const_first, min_enum_values=2, any_whitespace=False)
        assert not compiled.stats()["structure"]["shared"]
        matcher = Matcher(compiled)
        text = json.dumps({"x": stand_in, "y": NAMES[0]}).encode()
        assert matcher.accept_tokens(list(text)) == len(text) and matcher.value == {"x": stand_in, "y": NAMES[0]}


ANNOTATED: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "Call",
    "description": "A call",
    "$comment": "every annotation, where it annotates and where it is a name or a value",
    "type": "object",
    "properties": {
        "title": {"title": "Title", "type": "string", "default": "x", "examples": ["a"], "deprecated": True},
        "description": {
            "type": "array",
            "items": {"type": "integer", "readOnly": True, "description": "n"},
            "writeOnly": False,
        },
        "default": {"anyOf": [{"type": "null", "title": "none"}, {"$ref": "#/$defs/Choice", "description": "d"}]},
        "examples": {"enum": [{"title": "kept"}, "b", "c"], "description": "the values stay"},
        "const": {"const": {"description": "kept"}, "title": "c"},
        "pair": {"type": "array", "prefixItems": [{"type": "string", "title": "first"}], "items": False},
        "map": {"type": "object", "additionalProperties": {"type": "integer", "$comment": "v"}},
        "label": {"enum": NAMES[:6], "description": "a trie field where enums go to tries"},
    },
    "required": ["title", "description", "default", "label"],
    "$defs": {
        "Choice": {
            "title": "Choice",
            "type": "object",
            "properties": {"title": {"type": "boolean", "description": "flag"}},
            "required": ["title"],
        }
    },
}


def edited(node: Any) -> Any:
    """``node`` with every annotation's value changed (names and values that look like one stay)."""
    if isinstance(node, list):
        return [edited(child) for child in node]
    if not isinstance(node, dict):
        return node
    return {
        key: f"edited {value}"
        if key in ("title", "description", "$comment") and isinstance(value, str)
        else (value if key in ("enum", "const") else edited(value))
        for key, value in node.items()
    }


def test_annotations_leave_the_structure_where_xgrammar_never_reads_them() -> None:
    """xgrammar is given the structure without the annotations of its subschemas, which its
    grammar never reads (the same grammar, both spacings, for every schema of the suite);
    properties named like them and values that hold them stay; a $ref through such a name, or
    a schema deeper than the C walk goes, keeps them all; the C walk equals the reference and
    shares what it does not change."""
    stripped = without_annotations(ANNOTATED)
    assert stripped == _without_annotations_reference(ANNOTATED) and stripped is not ANNOTATED
    text = json.dumps(stripped)
    for gone in ('"$schema"', '"$comment"', '"A call"', '"Title"', '"flag"', '"deprecated"', '"readOnly"'):
        assert gone not in text
    assert list(stripped["properties"]) == list(ANNOTATED["properties"])
    assert stripped["properties"]["examples"]["enum"][0] == {"title": "kept"}
    assert stripped["properties"]["const"] == {"const": {"description": "kept"}}
    assert stripped["$defs"]["Choice"]["properties"] == {"title": {"type": "boolean"}}
    assert stripped["properties"]["map"] is not ANNOTATED["properties"]["map"]
    assert stripped["required"] is ANNOTATED["required"]  # (shared: nothing removed there)
    plain = {"type": "object", "properties": {"title": {"type": "string"}}}
    assert without_annotations(plain) is plain
    through = {"$defs": {"a": {"default": {"type": "string"}}}, "$ref": "#/$defs/a/default", "title": "t"}
    assert without_annotations(through) is through
    deep: dict[str, Any] = {"type": "string", "title": "deepest"}
    for _ in range(300):
        deep = {"type": "object", "properties": {"p": deep}, "title": "t"}
    assert without_annotations(deep) is deep  # (deeper than any schema load_schema admits)
    assert '"title"' not in json.dumps(_without_annotations_reference(deep))
    pydantic = pytest.importorskip("pydantic")

    class Place(pydantic.BaseModel):  # type: ignore[misc, name-defined]
        name: str = pydantic.Field(description="where", examples=["Paris"])
        kind: Literal["city", "region"] = "city"

    class Trip(pydantic.BaseModel):  # type: ignore[misc, name-defined]
        """A trip (pydantic gives every model and field a title, defaults, $defs and $refs)."""

        places: list[Place] = pydantic.Field(title="Stops", max_length=3)
        days: int | None = pydantic.Field(default=None, ge=1, description="how long")

    draft_04 = {  # (a $schema that names another draft, its "definitions")
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "array",
        "items": {"$ref": "#/definitions/item"},
        "definitions": {"item": {"type": "integer", "default": 1, "title": "item"}},
    }
    suite = (ANNOTATED, edited(ANNOTATED), Trip.model_json_schema(), draft_04, *SCHEMAS.values(), *UNIONS.values())
    checked = 0
    for schema in (*suite, UNENFORCED_SCHEMA):
        for any_whitespace in (False, True):
            expected = str(xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=any_whitespace))
            assert str(xgr.Grammar.from_json_schema(structure_text(schema), any_whitespace=any_whitespace)) == expected
            assert without_annotations(schema) == _without_annotations_reference(schema)
            checked += without_annotations(schema) is not schema
    assert checked >= 10


def test_schemas_that_differ_only_in_annotations_share_their_structure(
    byte_vocab: Vocabulary, byte_compiler: Compiler
) -> None:
    """An edited description or title (a tool's documentation, pydantic's model names) is the
    same structure: compiled once, with or without trie fields, each schema's masks its own
    text's; a property named "description" whose type changes is another structure."""
    for min_enum_values in (2, 10_000):
        first = byte_compiler.compile_json_schema(ANNOTATED, min_enum_values=min_enum_values)
        second = byte_compiler.compile_json_schema(edited(ANNOTATED), min_enum_values=min_enum_values)
        assert second.stats()["structure"]["shared"] and second._grammar is first._grammar
        assert second.schema == edited(ANNOTATED) != ANNOTATED  # (the schema as given, annotations included)
        reference = reference_compiler(byte_vocab).compile_json_schema(json.dumps(edited(ANNOTATED)))
        assert compare_walks(second, reference, byte_vocab, walks=6, steps=40, seed=min_enum_values) > 24
        retyped = json.loads(json.dumps(ANNOTATED))
        retyped["properties"]["description"] = {"type": "string", "description": "n"}
        other = byte_compiler.compile_json_schema(retyped, min_enum_values=min_enum_values)
        assert not other.stats()["structure"]["shared"]


def test_schemas_without_trie_fields_reuse_xgrammar_rule_masks(byte_vocab: Vocabulary, byte_compiler: Compiler) -> None:
    """A schema without trie fields compiles through xgrammar's caches (the masks of the rules
    the schemas before it compiled): every schema of the suite in turn, both spacings, gets the
    grammar an uncached compile of its text gives on the same vocabulary (extra tokens ``p +
    0x01`` where no string may hold a raw control, else ``p + 0xFF``; both occur), byte for
    byte; clear_structure_cache empties those caches."""
    support = vocabulary_support(byte_vocab)
    uncached = {lead: xgr.GrammarCompiler(support.tokenizer_info(lead), cache_enabled=False) for lead in (1, 0xFF)}
    checked, leads = 0, set()
    # (and the characters xgrammar's cache misreads in a parsed grammar's printed text: U+00FF,
    # other Latin-1, a control, an escape, beyond the BMP)
    latin = {
        "type": "object",
        "properties": {
            "k": {"enum": ["\u00ff", "\u00e9t\u00e9", "\u0080", "a\u0001b", '\\"', "\U0001f600"]},
            "c": {"const": "\u00ff\u00fe"},
        },
        "required": ["k", "c"],
    }
    for schema in (*SCHEMAS.values(), *UNIONS.values(), UNENFORCED_SCHEMA, latin):
        for any_whitespace in (False, True):
            options = {"min_enum_values": 10_000, "min_union_branches": 10_000, "unsupported": "ignore"}
            compiled = byte_compiler.compile_json_schema(schema, any_whitespace=any_whitespace, **options)
            if compiled.stats()["trie_fields"]:
                continue  # (a pattern or a format: a trie field at any size)
            # (on the vocabulary of p + 0x01 extra tokens where no string may hold a raw control)
            lead = compiled._lead
            expected = uncached[lead].compile_json_schema(json.dumps(schema), any_whitespace=any_whitespace)
            assert compiled._grammar.serialize_json() == expected.serialize_json()
            checked += 1
            leads.add(lead)
    assert checked >= 22 and leads == {1, 0xFF}
    matcher = Matcher(byte_compiler.compile_json_schema(latin, any_whitespace=False, min_enum_values=10_000))
    instance = {"k": "\u00ff", "c": "\u00ff\u00fe"}
    text = json.dumps(instance, ensure_ascii=False, separators=(", ", ": ")).encode()
    assert matcher.accept_tokens(list(text)) == len(text) and matcher.value == instance
    assert support.schema_compiler.get_cache_size_bytes() > 0 and support.loose_compiler.get_cache_size_bytes() > 0
    clear_structure_cache()
    assert support.schema_compiler.get_cache_size_bytes() == support.loose_compiler.get_cache_size_bytes() == 0


# Keywords xgrammar accepts but does not enforce, at several depths, in an order no set keeps.
UNENFORCED_SCHEMA = {
    "type": "object",
    "properties": {
        "tags": {"type": "array", "items": {"enum": [f"t{i}" for i in range(6)]}, "uniqueItems": True},
        "kind": {"enum": ["a", "b", "c"], "not": {"const": "b"}},
        "list": {"type": "array", "items": {"type": "integer"}, "contains": {"enum": ["x", "y", "z", "w"]}},
    },
    "required": ["tags", "kind", "list"],
    "if": {"properties": {"kind": {"const": "a"}}},
    "then": {"required": ["tags"]},
}
UNENFORCED_PATHS = (
    "$.if",
    "$.then",
    "$.properties.tags.uniqueItems",
    "$.properties.kind.not",
    "$.properties.list.contains",
)


def test_unenforced_keywords_compile_as_xgrammar_compiles_them(byte_compiler: Compiler) -> None:
    """A drop-in serves what the engine it replaces serves: keywords xgrammar does not enforce
    are compiled as it compiles them (the language is xgrammar's), reported in schema order
    (one warning per schema, ``unenforced``, ``stats()``), and refused only when asked."""
    with pytest.warns(UnenforcedSchemaWarning, match=r"'if' at \$\.if and 4 more") as caught:
        compiled = byte_compiler.compile_json_schema(UNENFORCED_SCHEMA, min_enum_values=3)
    assert len(caught) == 1 and caught[0].message.paths == UNENFORCED_PATHS  # type: ignore[union-attr]
    assert compiled.unenforced == UNENFORCED_PATHS == tuple(compiled.stats()["unenforced"])
    # the enums under enforced keywords go to tries; the one under "contains" stays xgrammar's
    assert [f["paths"] for f in compiled.stats()["trie_fields"]] == [
        ["$.properties.tags.items.enum"],
        ["$.properties.kind.enum"],
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet = byte_compiler.compile_json_schema(UNENFORCED_SCHEMA, min_enum_values=3, unsupported="ignore")
    assert quiet.unenforced == UNENFORCED_PATHS
    with pytest.raises(SchemaError, match=r"^\$\.if: .*\(5 such keywords\)") as info:
        byte_compiler.compile_json_schema(UNENFORCED_SCHEMA, unsupported="error")
    assert info.value.path == "$.if"
    # the language: xgrammar's for the same schema, judged on outputs both engines accept or refuse
    theirs_compiled = xgr.GrammarCompiler(
        xgr.TokenizerInfo([bytes([b]) for b in range(256)], xgr.VocabType.RAW, vocab_size=256)
    ).compile_json_schema(json.dumps(UNENFORCED_SCHEMA))
    for text, valid in [
        ('{"tags": ["t1", "t1"], "kind": "b", "list": [1]}', True),  # duplicates, "not", "contains": not enforced
        ('{"tags": ["t9"], "kind": "a", "list": []}', False),  # an enum is
        ('{"tags": [], "kind": "d", "list": []}', False),
    ]:
        data = text.encode()  # (token b is byte b in this vocabulary)
        assert xgr.GrammarMatcher(theirs_compiled).accept_string(text) is valid
        assert (Matcher(compiled).accept_tokens(list(data)) == len(data)) is valid
    # a saved schema reports them too (without warning again)
    assert pickle.loads(pickle.dumps(compiled)).unenforced == UNENFORCED_PATHS


# Discriminated unions (the discriminator a trie field, each branch compiled when chosen).
def _animal(kind: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"kind": {"type": "string", "const": kind}, **extra},
        "required": ["kind", *extra],
    }


UNIONS: dict[str, Any] = {
    "one call (a union at the root)": tools_as_any_of(TOOLS),
    "vLLM tool_choice=required (a union under items)": {
        "type": "array",
        "minItems": 1,
        "items": {"type": "object", **tools_as_any_of(TOOLS)},
    },
    "vLLM, parallel_tool_calls=False": {
        "type": "array",
        "minItems": 1,
        "maxItems": 1,
        "items": {"type": "object", **tools_as_any_of(TOOLS)},
    },
    "pydantic discriminated union after an enum field": {
        "type": "object",
        "properties": {
            "tag": {"enum": NAMES[:6]},
            "pet": {
                "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}, {"$ref": "#/$defs/Cow"}],
                "discriminator": {"propertyName": "kind"},
            },
        },
        "required": ["tag", "pet"],
        "$defs": {
            "Cat": _animal("cat", {"lives": {"type": "integer"}}),
            "Dog": _animal("dog", {"good": {"type": "boolean"}, "tags": {"type": "array", "items": {"enum": NAMES}}}),
            "Cow": _animal("cow", {}),
        },
    },
    "OpenAI-style events, each element a union": {
        "type": "object",
        "properties": {
            "events": {
                "type": "array",
                "items": {
                    "anyOf": [
                        {
                            "type": "object",
                            "properties": {"type": {"enum": [name]}, "at": {"type": "integer"}},
                            "required": ["type", "at"],
                        }
                        for name in ["click", "clack", "scroll", "key"]
                    ]
                },
            }
        },
        "required": ["events"],
    },
}


@pytest.mark.parametrize("any_whitespace", [False, True])
@pytest.mark.parametrize("name", sorted(UNIONS))
def test_discriminated_unions_equal_the_whole_schema(
    byte_vocab: Vocabulary, byte_compiler: Compiler, name: str, any_whitespace: bool
) -> None:
    schema = UNIONS[name]
    compiled = byte_compiler.compile_json_schema(
        schema, any_whitespace=any_whitespace, min_enum_values=2, min_union_branches=2
    )
    unions = compiled.stats()["unions"]
    assert len(unions) == 1 and unions[0]["branches"] >= 3, unions
    reference = reference_compiler(byte_vocab).compile_json_schema(json.dumps(schema), any_whitespace=any_whitespace)
    tally: Counter[str] = Counter()
    compared = compare_walks(
        compiled, reference, byte_vocab, walks=16, steps=90, seed=zlib.crc32(name.encode()), tally=tally
    )
    assert compared > 200 and tally["completed, strict JSON, valid"] >= 3, tally
    assert compiled.stats()["unions"][0]["choices_compiled"] >= 1


def _masks_along(
    compiled: CompiledSchema, tokens: list[int] | None, seed: int, steps: int = 60
) -> tuple[list[list[int]], list[int]]:
    """The allowed tokens at each step of a walk (``tokens``, else drawn from the masks,
    biased to quotes: the boundaries of the unions' discriminators), and the tokens taken."""
    rng = random.Random(seed)
    matcher = Matcher(compiled)
    masks: list[list[int]] = []
    taken: list[int] = []
    for at in range(steps if tokens is None else len(tokens)):
        allowed = matcher.allowed_token_ids().tolist()
        masks.append(allowed)
        if tokens is not None:
            token = tokens[at]
        elif not allowed:
            break
        else:
            quoted = [t for t in allowed if b'"' in (compiled._vocab.token_bytes(t) or b"")]
            token = rng.choice(quoted if quoted and rng.random() < 0.5 else allowed)
        assert matcher.accept_token(token)
        taken.append(token)
        if matcher.is_terminated():
            break
    return masks, taken


_AT_MOST_TWO = {  # the tokens that leave a discriminator differ between the calls: "}, only in the first
    "type": "array",
    "minItems": 1,
    "maxItems": 2,
    "items": {"anyOf": [{"properties": {"op": {"const": op}}, "required": ["op"]} for op in ("on", "off", "up")]},
}


@pytest.mark.parametrize("name", [*sorted(UNIONS), "compile_tools", "at most two calls"])
def test_what_follows_a_switching_value_is_kept_exactly(
    byte_compiler: Compiler, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What follows a union's discriminator or a tool's name is kept (the tokens that leave
    the value by the compiled schema, the configurations after it by the chosen schema) and
    handed out as forks, and the chosen branch's schema reads the output before it at once
    where no field can be entered there: masks along walks equal those of schemas that keep
    nothing and feed the output token by token, walk after walk on one compiled schema, and
    from several threads at once."""
    at_once = []
    original = SchemaEngine._enters_field

    def counted(self: SchemaEngine, matcher: Any, text: bytes) -> bool:
        found = original(self, matcher, text)
        at_once.append(not found)
        return found

    def compiled() -> CompiledSchema:
        options = {"any_whitespace": False, "min_enum_values": 2, "min_union_branches": 2}
        if name == "compile_tools":
            return byte_compiler.compile_tools(TOOLS, any_whitespace=False, min_enum_values=2)
        if name == "at most two calls":
            return Compiler(byte_vocabulary([*MERGES, b'"},', b'"}]'])).compile_json_schema(_AT_MOST_TWO, **options)
        return byte_compiler.compile_json_schema(UNIONS[name], **options)

    monkeypatch.setattr(SchemaEngine, "_enters_field", counted)
    kept = compiled()
    both = list(b'[{"op": "up"}, {"op": "up"}]')  # (byte tokens: the second call ends the array, the first not)
    walks = [_masks_along(kept, both if name == "at most two calls" else None, 0)]
    walks += [_masks_along(kept, None, seed) for seed in range(1, 6)]
    assert len(kept._exit_rows) > 0  # (the tokens that left the values chosen)
    if name in ("vLLM tool_choice=required (a union under items)", "OpenAI-style events, each element a union"):
        assert any(at_once), "the chosen branch never read the output at once"
    again = [_masks_along(kept, taken, 0) for _, taken in walks]  # (what the first walks kept)
    assert [masks for masks, _ in again] == [masks for masks, _ in walks]
    found: dict[int, Any] = {}
    threads = [
        threading.Thread(target=lambda i=i: found.setdefault(i, _masks_along(kept, walks[i][1], 0)))
        for i in range(len(walks))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [found[i][0] for i in range(len(walks))] == [masks for masks, _ in walks]
    # the reference: nothing kept (nothing fits), the output before a value fed token by token
    monkeypatch.setattr(SchemaEngine, "_enters_field", lambda self, matcher, text: bool(self._fields))
    monkeypatch.setattr(compiled_module, "EXIT_ROWS_BYTES", 0)
    monkeypatch.setattr(compiled_module, "KEPT_AFTER_BYTES", 0)
    clear_structure_cache()
    alone = compiled()
    assert [_masks_along(alone, taken, 0)[0] for _, taken in walks] == [masks for masks, _ in walks]
    assert len(alone._exit_rows) == len(alone._kept) == 0


def test_a_choice_that_ends_the_array_holds_no_union(byte_compiler: Compiler) -> None:
    """Where ``maxItems`` allows no element after the chosen one, the choice drops the union
    (``items`` false: the same grammar in xgrammar), so no trie field is left for it (without
    any, the choice compiles through xgrammar's caches); before that, the next element is a
    union again."""
    options = {"any_whitespace": False, "min_enum_values": 2, "min_union_branches": 2}
    single = byte_compiler.compile_json_schema(UNIONS["vLLM, parallel_tool_calls=False"], **options)
    choice = single._choice(0, 1)
    assert choice.schema["items"] is False and not choice.stats()["unions"]
    assert all(f["paths"][0].startswith("$.prefixItems[0].") for f in choice.stats()["trie_fields"])
    two = Compiler(byte_vocabulary([*MERGES, b'"},', b'"}]'])).compile_json_schema(_AT_MOST_TWO, **options)
    first = two._choice(0, 2)
    assert len(first.schema["prefixItems"]) == 1 and first.stats()["unions"]
    second = first._choice(0, 0)
    assert second.schema["items"] is False and not second.stats()["unions"] and not second.stats()["trie_fields"]


def test_unions_a_trie_cannot_decide_stay_xgrammars() -> None:
    def branch(first: str, value: Any, required: bool = True) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {first: {"const": value}, "x": {"type": "integer"}},
            "required": [first, "x"] if required else ["x"],
        }

    undecided = {
        "the discriminator is not the first property": {"anyOf": [branch("x", "a"), branch("kind", "b")]},
        "the first property is optional": {"anyOf": [branch("kind", "a", False), branch("kind", "b", False)]},
        "two branches share a value": {"anyOf": [branch("kind", "a"), branch("kind", "a")]},
        "a value is no string": {"anyOf": [branch("kind", 1), branch("kind", 2)]},
        "a branch is no object": {"anyOf": [branch("kind", "a"), {"type": "string"}]},
        "below additionalProperties (repeated, no items)": {
            "type": "object",
            "additionalProperties": {"anyOf": [branch("kind", "a"), branch("kind", "b")]},
        },
        "referenced from elsewhere": {
            "type": "object",
            "properties": {
                "u": {"anyOf": [branch("kind", "a"), branch("kind", "b")]},
                "v": {"$ref": "#/properties/u"},
            },
        },
        "recursive (a $ref to the root)": {
            "type": "object",
            "properties": {"u": {"anyOf": [branch("kind", "a"), branch("kind", "b")]}, "next": {"$ref": "#"}},
        },
        "under an array's items inside an array's items": {
            "type": "array",
            "items": {"type": "array", "items": {"anyOf": [branch("kind", "a"), branch("kind", "b")]}},
        },
    }
    costly = branch("kind", "b")
    costly["properties"] |= {f"p{i}": {"type": "string", "pattern": f"[a-z]{{{i + 1}}}x+"} for i in range(2)}
    undecided["a branch too costly to compile while decoding (2 patterns: 900 ms priced)"] = {
        "anyOf": [branch("kind", "a"), costly]
    }
    for name, schema in undecided.items():
        _, sites, _ = dispatch(schema, 2)
        assert not any(site.union for site in sites), name
    costly["properties"].pop("p1")  # (one pattern: 450 ms, within MAX_CHOICE_COMPILE_MS)
    assert any(site.union for site in dispatch({"anyOf": [branch("kind", "a"), costly]}, 2)[1])
    _, sites, _ = dispatch({"anyOf": [branch("kind", "a"), branch("kind", "b")]}, 3)
    assert not sites, "below min_enum_values: xgrammar's"


def test_union_schemas_round_trip_through_files(byte_vocab: Vocabulary, byte_compiler: Compiler, tmp_path: Any) -> None:
    schema = UNIONS["vLLM tool_choice=required (a union under items)"]
    compiled = byte_compiler.compile_json_schema(schema, any_whitespace=False, min_enum_values=2, min_union_branches=2)
    path = tmp_path / "union.tm"
    compiled.save(path)
    loaded = CompiledSchema.load(path, vocab=byte_vocab)
    assert loaded.stats()["unions"][0]["key"] == "name"
    text = b'[{"name": "get", "arguments": {"x": 3}}, {"name": "x", "arguments": {}}]'
    ours, theirs = Matcher(compiled), Matcher(loaded)
    for byte in text:
        assert (ours.allowed_token_ids() == theirs.allowed_token_ids()).all(), ours.text
        assert ours.accept_token(byte) and theirs.accept_token(byte), ours.text
    assert theirs.value == json.loads(text)


def test_qwen_vllm_required_tool_calls_over_real_functions() -> None:
    """vLLM's tool_choice="required" schema over real function schemas, its union a trie, on
    Qwen 151K: every mask judged by xgrammar's language for the whole union."""
    name = "qwen2"
    compiler, vocab = real_compiler(name), real_vocabulary(name).vocab
    schema = vllm_required_schema(tool_specs(load_tool_registry())[:24])
    compiled = compiler.compile_json_schema(schema, any_whitespace=False, min_enum_values=2, min_union_branches=2)
    assert compiled.stats()["unions"][0]["branches"] == 24
    reference = reference_compiler(vocab).compile_json_schema(json.dumps(schema), any_whitespace=False)
    compare_walks(compiled, reference, vocab, walks=3, steps=60, seed=3)


@pytest.mark.peers
@pytest.mark.parametrize("name", ["o200k_base", "mistral-spm-32k"])
def test_real_vocabularies_unions(name: str) -> None:
    compiler, vocab = real_compiler(name), real_vocabulary(name).vocab
    for shape in UNIONS.values():
        compiled = compiler.compile_json_schema(shape, any_whitespace=False, min_enum_values=2, min_union_branches=2)
        reference = reference_compiler(vocab).compile_json_schema(json.dumps(shape), any_whitespace=False)
        compare_walks(compiled, reference, vocab, walks=3, steps=60, seed=4, schema=shape)


def test_unused_definitions_hold_no_field(byte_compiler: Compiler) -> None:
    """A definition nothing refers to is out of xgrammar's grammar: its enums are no fields."""
    schema = {
        "type": "object",
        "properties": {"a": {"enum": NAMES[:4]}},
        "required": ["a"],
        "$defs": {"Unused": {"enum": NAMES}, "Used": {"enum": NAMES[:3]}, "Via": {"$ref": "#/$defs/Used"}},
    }
    compiled = byte_compiler.compile_json_schema(schema, min_enum_values=2, min_union_branches=2)
    assert [f["paths"] for f in compiled.stats()["trie_fields"]] == [["$.properties.a.enum"]]
    for reference in ("#/$defs/Via", "#/%24defs/Used"):  # (the URI-fragment form too: xgrammar resolves it)
        schema["properties"]["b"] = {"$ref": reference}
        compiled = byte_compiler.compile_json_schema(schema, min_enum_values=2, min_union_branches=2)
        paths = [f["paths"] for f in compiled.stats()["trie_fields"]]
        assert paths == [["$.properties.a.enum"], ["$.$defs.Used.enum"]], reference


@pytest.mark.parametrize("name", sorted(UNIONS))
def test_a_choice_leaves_the_schema_as_it_was(name: str) -> None:
    text = json.dumps(UNIONS[name])
    loaded = json.loads(text)
    (site,) = [s for s in dispatch(json.loads(text), 2)[1] if s.union is not None]
    assert site.union is not None
    for branch in range(len(site.values)):
        chosen = site.union.chosen(loaded, branch)
        assert json.dumps(loaded) == text, "the schema was modified"
        assert chosen != loaded and len(json.dumps(chosen)) != len(text)
