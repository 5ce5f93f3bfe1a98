"""Compiled schemas and tool lists in triemask's file format: save, load (read or mapped),
pickle and the compile cache's disk tier give schemas whose masks are the whole schema's
language; corrupt, foreign and inconsistent files are refused with typed errors."""

from __future__ import annotations

import json
import pickle
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import byte_vocabulary
from test_schemas import MERGES, SCHEMAS, TOOLS, compare_walks, reference_compiler, tools_as_any_of
from triemask import (
    AutomatonFileError,
    CompileCache,
    CompiledSchema,
    CompiledTools,
    Compiler,
    Matcher,
    TrieAutomaton,
    Vocabulary,
)
from triemask.base.storage import checksum

xgr = pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def byte_vocab() -> Vocabulary:
    return byte_vocabulary(MERGES)


@pytest.fixture(scope="module")
def byte_compiler(byte_vocab: Vocabulary) -> Compiler:
    return Compiler(byte_vocab, disk_cache=False)


def masks_along(compiled: CompiledSchema, tokens: list[int]) -> list[list[int]]:
    """The allowed tokens before each of ``tokens`` (fed one by one while they are allowed)."""
    matcher = Matcher(compiled)
    found = []
    for token in tokens:
        allowed = matcher.allowed_token_ids().tolist()
        found.append(allowed)
        if token not in allowed:
            break
        assert matcher.accept_token(token)
    return found


@pytest.mark.parametrize("how", ["mmap", "read", "pickle"])
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schemas_round_trip(
    byte_vocab: Vocabulary, byte_compiler: Compiler, name: str, how: str, tmp_path: Path
) -> None:
    schema = SCHEMAS[name]
    compiled = byte_compiler.compile_json_schema(schema, min_enum_values=2, any_whitespace=False)
    if how == "pickle":
        loaded = pickle.loads(pickle.dumps(compiled))
    else:
        compiled.save(tmp_path / "schema.tm")
        loaded = CompiledSchema.load(tmp_path / "schema.tm", vocab=byte_vocab, mmap=how == "mmap")
    assert type(loaded) is CompiledSchema and loaded is not compiled
    assert loaded.schema == compiled.schema and loaded.fingerprint == compiled.fingerprint
    assert [f["paths"] for f in loaded.stats()["trie_fields"]] == [f["paths"] for f in compiled.stats()["trie_fields"]]
    assert loaded.stats()["options"] == compiled.stats()["options"]
    reference = reference_compiler(byte_vocab).compile_json_schema(json.dumps(schema), any_whitespace=False)
    assert compare_walks(loaded, reference, byte_vocab, walks=6, steps=40, seed=zlib.crc32(name.encode())) > 12


@pytest.mark.parametrize("how", ["mmap", "pickle"])
def test_tool_lists_round_trip(byte_vocab: Vocabulary, byte_compiler: Compiler, how: str, tmp_path: Path) -> None:
    compiled = byte_compiler.compile_tools(TOOLS, min_enum_values=2, cache_bytes=1 << 20)
    if how == "pickle":
        loaded = pickle.loads(pickle.dumps(compiled))
    else:
        compiled.save(tmp_path / "tools.tm")
        loaded = CompiledTools.load(tmp_path / "tools.tm", vocab=byte_compiler)
    assert isinstance(loaded, CompiledTools) and loaded.tool_names == compiled.tool_names
    assert loaded.stats()["tools"]["argument_cache_limit"] == 1 << 20
    assert loaded.stats()["tools"]["argument_schemas_cached"] == 0  # argument schemas compile again on demand
    reference = reference_compiler(byte_vocab).compile_json_schema(json.dumps(tools_as_any_of(TOOLS)))
    compare_walks(loaded, reference, byte_vocab, walks=12, steps=50, seed=11, schema=tools_as_any_of(TOOLS))


def test_loading_checks_vocabulary_and_kind(byte_vocab: Vocabulary, byte_compiler: Compiler, tmp_path: Path) -> None:
    byte_compiler.compile_json_schema(SCHEMAS["enum first"], min_enum_values=2).save(tmp_path / "schema.tm")
    byte_compiler.compile_tools(TOOLS).save(tmp_path / "tools.tm")
    byte_compiler.compile(["a", "b"]).save(tmp_path / "set.tm")
    other = byte_vocabulary([b"get"])
    with pytest.raises(AutomatonFileError, match="compiled for the vocabulary with fingerprint") as raised:
        CompiledSchema.load(tmp_path / "schema.tm", vocab=other)
    assert raised.value.field == "vocab_fingerprint"
    with pytest.raises(AutomatonFileError, match="holds a CompiledSchema, not a CompiledTools") as raised:
        CompiledTools.load(tmp_path / "schema.tm", vocab=byte_vocab)
    assert raised.value.field == "kind"
    assert isinstance(CompiledSchema.load(tmp_path / "tools.tm", vocab=byte_vocab), CompiledTools)
    for wrong, path in ((CompiledSchema, "set.tm"), (TrieAutomaton, "schema.tm")):
        with pytest.raises(AutomatonFileError, match=r"holds a '(trie|schema)'") as raised:
            wrong.load(tmp_path / path, vocab=byte_vocab)
        assert raised.value.field == "kind"
    with pytest.raises(TypeError, match="load needs vocab="):
        CompiledSchema.load(tmp_path / "schema.tm", vocab="qwen")


def _rewrite(path: Path, change_header: Any = None, arrays: dict[str, np.ndarray] | None = None) -> None:
    """Change a file's header (a function of the header dict) and arrays in place (same sizes),
    with valid checksums: a file that passes every checksum but says something else."""
    data = bytearray(path.read_bytes())
    magic, version, length, _ = struct.unpack_from("<8sIII", data, 0)
    header = json.loads(bytes(data[64 : 64 + length]))
    for name, array in (arrays or {}).items():
        entry = header["arrays"][name]
        raw = np.ascontiguousarray(array, dtype=np.dtype(entry["dtype"])).tobytes()
        assert len(raw) == entry["nbytes"] < 1 << 22
        data[entry["offset"] : entry["offset"] + len(raw)] = raw
        entry["checksums"] = [checksum(raw)]
    if change_header is not None:
        change_header(header)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    assert len(text) <= length
    text = text.ljust(length)  # JSON allows the padding
    struct.pack_into("<8sIII", data, 0, magic, version, length, zlib.crc32(text))
    data[64 : 64 + length] = text
    path.write_bytes(bytes(data))


def test_inconsistent_files_are_refused(byte_vocab: Vocabulary, byte_compiler: Compiler, tmp_path: Path) -> None:
    path = tmp_path / "schema.tm"
    compiled = byte_compiler.compile_json_schema(SCHEMAS["enum first"], min_enum_values=2)
    compiled.save(path)
    original = path.read_bytes()

    def other_pieces(header: dict[str, Any]) -> None:
        header["meta"]["fields"][0]["pieces_fingerprint"] = "0" * 32

    _rewrite(path, other_pieces)
    with pytest.raises(AutomatonFileError, match="cuts tokens into other pieces") as raised:
        CompiledSchema.load(path, vocab=byte_vocab)
    assert raised.value.field == "pieces_fingerprint"

    for name in ("exit_nodes", "exit_values", "tail_nodes", "crossing", "enter_words"):
        path.write_bytes(original)
        header_length = struct.unpack_from("<I", original, 12)[0]
        entry = json.loads(original[64 : 64 + header_length])["arrays"][f"f0.{name}"]
        if entry["nbytes"] == 0:
            continue
        array = np.frombuffer(original, dtype=np.dtype(entry["dtype"]), count=entry["shape"][0], offset=entry["offset"])
        broken = array.copy()
        broken[-1] = 10**6
        _rewrite(path, arrays={f"f0.{name}": broken})
        with pytest.raises(AutomatonFileError, match="do not form a compiled schema") as raised:
            CompiledSchema.load(path, vocab=byte_vocab)
        assert raised.value.field == "arrays", name

    path.write_bytes(original)

    def automaton_of_other_vocabulary(header: dict[str, Any]) -> None:
        header["meta"]["fields"][0]["automaton_meta"]["vocab_fingerprint"] = "0" * 32

    _rewrite(path, automaton_of_other_vocabulary)
    with pytest.raises(AutomatonFileError, match="name another vocabulary than its header"):
        CompiledSchema.load(path, vocab=byte_vocab)


# a structure whose strings admit a raw control (xgrammar's "." takes one), beside an enum
CONTROLS_AND_ENUM = {
    "type": "object",
    "properties": {"note": {"type": "string", "pattern": "a.b"}, "name": {"enum": ["get", "put", "post"]}},
    "required": ["note", "name"],
}


def _header(path: Path) -> dict[str, Any]:
    length = struct.unpack_from("<I", path.read_bytes(), 12)[0]
    header: dict[str, Any] = json.loads(path.read_bytes()[64 : 64 + length])
    return header


def test_a_fields_entry_begins_with_a_control_only_where_no_string_holds_one(
    byte_vocab: Vocabulary, byte_compiler: Compiler, tmp_path: Path
) -> None:
    """The sentinels' lead: 0x01 (a grammar xgrammar compiles from its text, through its caches)
    where no string of the structure admits a raw control, else 0xFF; a file whose sentinels
    begin with 0x01 over a structure whose strings admit controls (a string could forge the
    field's entry there) is refused."""
    path = tmp_path / "schema.tm"
    for schema, lead in (
        (SCHEMAS["enum first"], "01"),
        (SCHEMAS["formats and patterns"], "01"),
        (CONTROLS_AND_ENUM, "ff"),
    ):
        byte_compiler.compile_json_schema(schema, min_enum_values=2).save(path)
        assert {f["sentinel"][:2] for f in _header(path)["meta"]["fields"]} == {lead}, schema

    def control_leads(header: dict[str, Any]) -> None:
        for field in header["meta"]["fields"]:
            field["sentinel"] = "01" + field["sentinel"][2:]

    _rewrite(path, control_leads)
    with pytest.raises(AutomatonFileError, match="do not fit its structure's grammar") as raised:
        CompiledSchema.load(path, vocab=byte_vocab)
    assert raised.value.field == "sentinel"
    # without trie fields: the file names the vocabulary its grammar was compiled on (p + 0x01
    # extra tokens where no string may hold a raw control), and a lead that is none is refused
    plain = byte_compiler.compile_json_schema({"type": "object", "properties": {"s": {"type": "string"}}})
    plain.save(path)
    assert _header(path)["meta"]["lead"] == 1
    original = path.read_bytes()
    for wrong in (7, "1", [1]):
        path.write_bytes(original)
        _rewrite(path, lambda header, wrong=wrong: header["meta"].update(lead=wrong))
        with pytest.raises(AutomatonFileError, match="do not fit its structure's grammar"):
            CompiledSchema.load(path, vocab=byte_vocab)


@pytest.mark.parametrize("schema", [SCHEMAS["adjacent enums"], CONTROLS_AND_ENUM], ids=["lead 0x01", "lead 0xFF"])
def test_a_grammar_xgrammar_no_longer_reads_is_compiled_again(
    byte_vocab: Vocabulary,
    byte_compiler: Compiler,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    schema: dict[str, Any],
) -> None:
    """From the structure's text, with either lead of the fields' sentinels."""
    compiled = byte_compiler.compile_json_schema(schema, min_enum_values=2, any_whitespace=False)
    compiled.save(tmp_path / "schema.tm")

    def refuse(*args: Any) -> Any:
        raise RuntimeError("DeserializeVersionError: the serialization version differs")

    monkeypatch.setattr(xgr.CompiledGrammar, "deserialize_json", staticmethod(refuse))
    loaded = CompiledSchema.load(tmp_path / "schema.tm", vocab=byte_vocab)
    reference = reference_compiler(byte_vocab).compile_json_schema(json.dumps(schema), any_whitespace=False)
    assert compare_walks(loaded, reference, byte_vocab, walks=6, steps=40, seed=3) > 12


@pytest.fixture(scope="module")
def saved_schema(byte_compiler: Compiler, tmp_path_factory: pytest.TempPathFactory) -> tuple[CompiledSchema, bytes]:
    compiled = byte_compiler.compile_json_schema(SCHEMAS["array and nested"], min_enum_values=2)
    path = tmp_path_factory.mktemp("saved") / "schema.tm"
    compiled.save(path)
    return compiled, path.read_bytes()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_corrupt_schema_files_are_refused_or_equal(
    data: st.DataObject, byte_vocab: Vocabulary, saved_schema: tuple[CompiledSchema, bytes], tmp_path: Path
) -> None:
    """Flipped, overwritten, cut or appended bytes: a typed error, or a schema with the same
    masks along a walk (a change in padding)."""
    compiled, original = saved_schema
    path = tmp_path / "fuzz-schema.tm"
    raw = bytearray(original)
    for _ in range(data.draw(st.integers(1, 3))):
        action = data.draw(st.sampled_from(["flip", "byte", "cut", "append"]))
        if action == "cut" and raw:
            raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
        elif action in ("append", "cut"):
            raw += data.draw(st.binary(min_size=1, max_size=64))
        elif raw:
            at = data.draw(st.integers(0, len(raw) - 1))
            raw[at] = (
                raw[at] ^ (1 << data.draw(st.integers(0, 7))) if action == "flip" else data.draw(st.integers(0, 255))
            )
    path.write_bytes(bytes(raw))
    try:
        loaded = CompiledSchema.load(path, vocab=byte_vocab, mmap=data.draw(st.booleans()))
    except AutomatonFileError:
        return
    walk = [ord(c) for c in '{"tags": ["a", "get"], "inner": {"kind": "x"}}']
    assert masks_along(loaded, walk) == masks_along(compiled, walk)


def test_the_compile_cache_keeps_schemas_in_memory_and_on_disk(byte_compiler: Compiler, tmp_path: Path) -> None:
    schema = SCHEMAS["enum first"]
    cache = CompileCache(directory=tmp_path)
    first = cache.compile_schema(byte_compiler, schema, min_enum_values=2)
    assert cache.compile_schema(byte_compiler, json.dumps(schema), min_enum_values=2) is first  # its text
    # the same keys in another order are another language: xgrammar emits properties in order
    reordered = json.loads(json.dumps(schema, sort_keys=True))
    assert list(reordered["properties"]) != list(schema["properties"])
    assert cache.compile_schema(byte_compiler, reordered, min_enum_values=2) is not first
    assert cache.compile_schema(byte_compiler, schema, min_enum_values=3) is not first  # other options
    tools = cache.compile_schema(byte_compiler, TOOLS, tools=True)
    assert isinstance(tools, CompiledTools)
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["disk_writes"]) == (1, 4, 4)

    restarted = CompileCache(directory=tmp_path)  # another process: mapped from the disk tier
    again = restarted.compile_schema(byte_compiler, schema, min_enum_values=2)
    assert again is not first and again.fingerprint == first.fingerprint
    assert isinstance(restarted.compile_schema(byte_compiler, TOOLS, tools=True), CompiledTools)
    assert restarted.stats()["disk_hits"] == 2
    walk = [ord(c) for c in '{"name": "get_users", "count": 3}']
    assert masks_along(again, walk) == masks_along(first, walk)
    restarted.clear(disk=True)
    assert not list(tmp_path.glob("*.tm"))


def test_a_schema_file_answers_only_for_its_own_schema(byte_compiler: Compiler, tmp_path: Path) -> None:
    """Schema B's file copied under A's name (or a tool list's, or another option's) is not
    served for A: it is compiled again, and the file replaced."""
    a, b = SCHEMAS["enum first"], SCHEMAS["adjacent enums"]
    cache = CompileCache(directory=tmp_path)
    cache.compile_schema(byte_compiler, a, min_enum_values=2)
    file_a = next(tmp_path.glob("schema-*.tm"))
    for other, options, tools in ((b, {"min_enum_values": 2}, False), (a, {"min_enum_values": 3}, False)):
        file_a.unlink()
        fresh = CompileCache(directory=tmp_path)
        fresh.compile_schema(byte_compiler, other, tools=tools, **options)
        next(tmp_path.glob("schema-*.tm")).rename(file_a)  # the other one's file under A's name
        restarted = CompileCache(directory=tmp_path)
        served = restarted.compile_schema(byte_compiler, a, min_enum_values=2)
        assert restarted.stats()["disk_hits"] == 0 and served.compiled_from(a, min_enum_values=2)
        assert served.schema == a
    compiled = byte_compiler.compile_json_schema(a, min_enum_values=2)
    assert compiled.compiled_from(json.dumps(a), min_enum_values=2)
    assert not compiled.compiled_from(a) and not compiled.compiled_from(a, min_enum_values=2, any_whitespace=False)
    assert not compiled.compiled_from(a, min_enum_values=2, unknown=1) and not compiled.compiled_from("{x")
    tools = byte_compiler.compile_tools(TOOLS)
    assert tools.compiled_from(TOOLS) and not tools.compiled_from(TOOLS[:2]) and not tools.compiled_from(a)
