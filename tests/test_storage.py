"""Saved automata: the file format, loading (read and memory-mapped), pickling through it,
and every way a file can be wrong."""

from __future__ import annotations

import json
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import byte_vocabulary
from triemask import (
    ArgumentTypeError,
    AutomatonFileError,
    CompileCache,
    Compiler,
    DagAutomaton,
    LazyTrieAutomaton,
    Matcher,
    TrieAutomaton,
    TriemaskError,
)
from triemask.base import storage as _storage
from triemask.base.storage import checksum

VALUES = ["get_user", "get_users", "delete_user", "a", "", "é"]


def compiled(layout: str) -> TrieAutomaton:
    compiler = Compiler(byte_vocabulary([b"get", b"_user", b"us", b"er"]))
    if layout == "regex":
        return compiler.compile_regex(r"(19|20)[0-9]{2}-0[1-9]")
    return compiler.compile(VALUES, layout=layout)


def assert_equal_everywhere(a: TrieAutomaton, b: TrieAutomaton) -> None:
    assert type(a) is type(b)
    assert (a.num_states, a.num_values, a.vocab_fingerprint, a.eos) == (
        b.num_states,
        b.num_values,
        b.vocab_fingerprint,
        b.eos,
    )
    assert a.set_fingerprint == b.set_fingerprint
    width = (a.vocab_size + 31) // 32
    rows_a, rows_b = np.zeros((a.num_states, width), np.int32), np.zeros((a.num_states, width), np.int32)
    a.fill_bitmask(rows_a, list(range(a.num_states)))
    b.fill_bitmask(rows_b, list(range(b.num_states)))
    assert np.array_equal(rows_a, rows_b)
    for state in range(a.num_states):
        allowed = a.allowed_token_ids(state)
        assert np.array_equal(b.allowed_token_ids(state), allowed)
        assert [b.next_state(state, t) for t in allowed.tolist()] == [a.next_state(state, t) for t in allowed.tolist()]
        if not isinstance(a, DagAutomaton):  # a DAG's state does not name its text
            assert b.value_of(state) == a.value_of(state)
    if isinstance(a, DagAutomaton) and isinstance(b, DagAutomaton):
        assert [b.value(i) for i in range(min(a.num_values, 50))] == [a.value(i) for i in range(min(a.num_values, 50))]
    else:
        assert b.values() == a.values()


@pytest.mark.parametrize("layout", ["trie", "dag", "lazy", "regex"])
@pytest.mark.parametrize("mmap", [True, False])
def test_round_trips_are_equal_at_every_state(layout: str, mmap: bool, tmp_path: Path) -> None:
    automaton = compiled(layout)
    path = tmp_path / "set.tm"
    automaton.save(path)
    loaded = TrieAutomaton.load(path, vocab=byte_vocabulary([b"get", b"_user", b"us", b"er"]), mmap=mmap)
    assert_equal_everywhere(automaton, loaded)
    assert_equal_everywhere(automaton, pickle.loads(pickle.dumps(automaton)))
    if isinstance(loaded, DagAutomaton):
        assert loaded.pattern == automaton.pattern  # type: ignore[attr-defined]
    matcher = Matcher(loaded)
    assert matcher.accept_tokens(list(b"2019-0" if layout == "regex" else b"a")) == (6 if layout == "regex" else 1)
    assert not list(tmp_path.glob("*.part"))  # written through a temporary name, then renamed


def test_same_set_same_fingerprint_whatever_the_order_or_layout() -> None:
    compiler = Compiler(byte_vocabulary())
    a = compiler.compile(["b", "a", "c"])
    b = compiler.compile(["c", "a", "b", "a"])
    lazy = compiler.compile(["a", "c", "b"], layout="lazy")
    assert a.set_fingerprint == b.set_fingerprint == lazy.set_fingerprint
    assert compiler.compile(["a", "b"]).set_fingerprint != a.set_fingerprint
    assert compiler.compile([b"a", b"b", b"c"]).set_fingerprint != a.set_fingerprint  # bytes are another set


def test_loading_checks_the_vocabulary_and_the_kind(tmp_path: Path) -> None:
    path = tmp_path / "set.tm"
    compiled("trie").save(path)
    with pytest.raises(AutomatonFileError, match="compiled for the vocabulary with fingerprint") as raised:
        TrieAutomaton.load(path, vocab=byte_vocabulary())
    assert raised.value.field == "vocab_fingerprint"
    vocab = byte_vocabulary([b"get", b"_user", b"us", b"er"])
    with pytest.raises(AutomatonFileError, match="holds a TrieAutomaton, not a LazyTrieAutomaton") as raised:
        LazyTrieAutomaton.load(path, vocab=vocab)
    assert raised.value.field == "kind"
    with pytest.raises(ArgumentTypeError, match="load needs vocab="):
        TrieAutomaton.load(path, vocab="qwen")
    with pytest.raises(AutomatonFileError, match="cannot read file") as raised:
        TrieAutomaton.load(tmp_path / "missing.tm", vocab=vocab)
    assert raised.value.field == "file"


def _rewrite_header(path: Path, change: dict[str, object]) -> None:
    data = bytearray(path.read_bytes())
    magic, version, length, _ = struct.unpack_from("<8sIII", data, 0)
    header = json.loads(bytes(data[64 : 64 + length]))
    header.update(change)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode().ljust(length)  # JSON allows the padding
    assert len(text) == length
    struct.pack_into("<8sIII", data, 0, magic, version, length, zlib.crc32(text))
    data[64 : 64 + length] = text
    path.write_bytes(bytes(data))


def test_newer_truncated_and_foreign_files_are_named(tmp_path: Path) -> None:
    vocab = byte_vocabulary([b"get", b"_user", b"us", b"er"])
    path = tmp_path / "set.tm"
    compiled("trie").save(path)
    original = path.read_bytes()

    for version, message in ((99, "format version 99, newer than this triemask reads"), (1, "older than")):
        changed = bytearray(original)
        struct.pack_into("<I", changed, 8, version)
        path.write_bytes(bytes(changed))
        with pytest.raises(AutomatonFileError, match=message) as raised:
            TrieAutomaton.load(path, vocab=vocab)
        assert raised.value.field == "format_version"

    path.write_bytes(original[: len(original) - 100])
    with pytest.raises(AutomatonFileError, match="truncated") as raised:
        TrieAutomaton.load(path, vocab=vocab)
    assert raised.value.field == "size"

    path.write_bytes(b"PK\x03\x04" + original[4:])
    with pytest.raises(AutomatonFileError, match="not a triemask file") as raised:
        TrieAutomaton.load(path, vocab=vocab)

    path.write_bytes(original)
    _rewrite_header(path, {"kind": "graph"})
    with pytest.raises(AutomatonFileError, match="holds a 'graph'"):
        TrieAutomaton.load(path, vocab=vocab)

    header = json.loads(original[64 : 64 + struct.unpack_from("<I", original, 12)[0]])
    assert header["arrays"]["dense_nodes"]["shape"][0] > 0  # the root's row is stored whole
    for name in ("edge_dests", "dense_nodes"):  # a valid checksum over arrays that do not fit together
        data = bytearray(original)
        entry = header["arrays"][name]
        changed = np.frombuffer(data, dtype=np.int32, count=entry["shape"][0], offset=entry["offset"]).copy()
        changed[0] = 10**6
        data[entry["offset"] : entry["offset"] + entry["nbytes"]] = changed.tobytes()
        path.write_bytes(bytes(data))
        _rewrite_header(
            path, {"arrays": {**header["arrays"], name: {**entry, "checksums": [checksum(changed.tobytes())]}}}
        )
        with pytest.raises(AutomatonFileError, match="is corrupt") as raised:
            TrieAutomaton.load(path, vocab=vocab)
        assert raised.value.field in (name, "arrays"), name

    # a file without the (derived, optional) dense-node list loads the same automaton
    path.write_bytes(original)
    _rewrite_header(path, {"arrays": {k: v for k, v in header["arrays"].items() if k != "dense_nodes"}})
    assert_equal_everywhere(compiled("trie"), TrieAutomaton.load(path, vocab=vocab))


def test_only_regular_files_are_read(tmp_path: Path) -> None:
    """A FIFO (which would block the reader forever), a link to /dev/zero (which would read
    without bound), a folder: refused before a byte is read, with the field named."""
    vocab = byte_vocabulary([b"get", b"_user", b"us", b"er"])
    fifo = tmp_path / "fifo.tm"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.tm"
    zero.symlink_to("/dev/zero")
    for path in (fifo, zero, tmp_path):
        for use_mmap in (True, False):
            with pytest.raises(AutomatonFileError, match="not a regular file") as raised:
                TrieAutomaton.load(path, vocab=vocab, mmap=use_mmap)
            assert raised.value.field == "file"


def test_headers_are_bounded_in_size_and_depth(tmp_path: Path) -> None:
    vocab = byte_vocabulary([b"get", b"_user", b"us", b"er"])
    path = tmp_path / "set.tm"
    compiled("trie").save(path)
    original = path.read_bytes()
    changed = bytearray(original)
    struct.pack_into("<I", changed, 12, (1 << 22) + 1)  # a header of 4 MiB and one byte
    path.write_bytes(bytes(changed) + b" " * (1 << 22))
    with pytest.raises(AutomatonFileError, match="more than the format allows") as raised:
        TrieAutomaton.load(path, vocab=vocab)
    assert raised.value.field == "header"
    deep = b"[" * 200_000 + b"]" * 200_000  # valid JSON nested past Python's recursion limit
    preamble = struct.pack("<8sIII", b"TRIEMASK", 2, len(deep), zlib.crc32(deep)).ljust(64, b"\0")
    path.write_bytes(preamble + deep)
    with pytest.raises(AutomatonFileError, match="header is unreadable") as raised:
        TrieAutomaton.load(path, vocab=vocab)
    assert raised.value.field == "header"


def _crafted(path: Path, automaton: TrieAutomaton, meta: dict[str, object], arrays: dict[str, object]) -> None:
    """A file with valid checksums whose fields were changed (what a careless or hostile
    writer makes, not what corruption does)."""
    kind, stored_meta, stored_arrays = automaton.file_parts()
    _storage.write(
        path,
        kind,
        {**stored_meta, **meta},
        {**stored_arrays, **arrays},
        vocab_fingerprint=automaton.vocab_fingerprint,
        set_fingerprint=automaton.set_fingerprint,
    )


def _changed(array: np.ndarray, at: int, value: int) -> np.ndarray:
    changed = array.copy()
    changed[at] = value
    return changed


def crafted_cases(automaton: TrieAutomaton) -> list[tuple[str, dict[str, object], dict[str, object]]]:
    """(the field at fault, meta changes, array changes) for files that must be refused."""
    _, meta, arrays = automaton.file_parts()
    if isinstance(automaton, LazyTrieAutomaton):
        words = arrays["node_word"]
        other = Compiler(byte_vocabulary([b"xy"])).compile(VALUES, layout="lazy").file_parts()[2]
        return [
            ("vocab_size", {"vocab_size": 2**31 - 1}, {}),
            ("node_word", {}, {"node_word": _changed(words, 0, int(words[0]) + 1)}),
            ("node_word", {}, {"node_word": _changed(words, 0, int(words[0]) | 0x2000)}),
            ("terminal_blocks", {}, {"node_word": _changed(words, 1, int(words[1]) ^ 0x8000)}),
            ("node_byte", {}, {"node_byte": _changed(arrays["node_byte"], 1, 0xFF)}),  # not UTF-8, or out of order
            ("level_offsets", {}, {"level_offsets": arrays["level_offsets"][:-1]}),
            ("value_nodes", {}, {"value_nodes": arrays["value_nodes"][::-1].copy()}),
            ("terminal_values", {}, {"terminal_values": np.zeros_like(arrays["terminal_values"])}),
            ("token_children", {}, {f"token_{k}": other[f"token_{k}"] for k in ("children", "node_byte")}),
        ]
    dests, starts = arrays["edge_dests"], arrays["value_starts"]
    down = int(np.flatnonzero(dests > 1)[0])  # an edge from the root or deeper, made to lead back up
    cases: list[tuple[str, dict[str, object], dict[str, object]]] = [
        ("vocab_size", {"vocab_size": 100_000}, {}),
        ("vocab_size", {"vocab_size": 2**31 - 1}, {}),  # no rows allocated before the refusal
        ("vocab_size", {"vocab_size": 0}, {}),
        ("eos_token_ids", {"eos_token_ids": [5]}, {}),
        ("eos_token_ids", {"eos_token_ids": "x"}, {}),
        ("values_are_str", {"values_are_str": 1}, {}),
        ("edge_tokens", {}, {"edge_tokens": arrays["edge_tokens"].astype(np.int64)}),
        ("edge_tokens", {}, {"edge_tokens": _changed(arrays["edge_tokens"], 0, meta["vocab_size"])}),
        ("edge_dests", {}, {"edge_dests": _changed(dests, down, 0)}),
        ("terminal_nodes", {}, {"terminal_nodes": _changed(arrays["terminal_nodes"], -1, len(dests) + 99)}),
        ("terminal_values", {}, {"terminal_values": _changed(arrays["terminal_values"], 0, len(starts) + 5)}),
        ("value_starts", {}, {"value_starts": _changed(starts, -1, int(starts[-1]) + 1)}),
        ("level_offsets", {}, {"level_offsets": arrays["level_offsets"][:-1]}),
    ]
    if meta["values_are_str"] and len(arrays["value_flat"]):
        cases.append(("value_flat", {}, {"value_flat": _changed(arrays["value_flat"], 0, 0xFF)}))
    if isinstance(automaton, DagAutomaton):
        source = arrays["dag_source"]
        cases += [
            ("dag_dest", {}, {"dag_source": _changed(source, 0, automaton.num_nodes - 1)}),  # an edge back up
            ("spell_ids", {}, {"spell_ids": _changed(arrays["spell_ids"], -1, meta["vocab_size"])}),
            ("dag_accepting", {}, {"dag_accepting": arrays["dag_accepting"][:0]}),
        ]
    return cases


def test_another_sets_edges_under_these_values_are_refused(tmp_path: Path) -> None:
    """A file whose value arrays are one set's and whose edges (valid, consistent, checksummed)
    are another's of the same shape: refused by the default load, which walks every edge's token
    against its values' trie; ``verify=False`` trusts the file (and loads it)."""
    vocab = byte_vocabulary([b"get", b"_user", b"us", b"er"])
    compiler = Compiler(vocab)
    mine, other = compiler.compile(["ab", "ac"]), compiler.compile(["xb", "xc"])  # the same trie shape
    _, _, theirs = other.file_parts()
    path = tmp_path / "lying.tm"
    _crafted(path, mine, {}, {name: theirs[name] for name in ("edge_offsets", "edge_tokens", "edge_dests")})
    with pytest.raises(AutomatonFileError, match="does not spell the path") as raised:
        TrieAutomaton.load(path, vocab=vocab)
    assert raised.value.field == "edge_tokens"
    assert TrieAutomaton.load(path, vocab=vocab, verify=False).num_values == 2
    _, _, arrays = mine.file_parts()
    dests = arrays["edge_dests"].copy()
    final = int(np.flatnonzero(dests >= mine.num_nodes)[0])
    dests[final] = mine.num_nodes + (1 - (int(dests[final]) - mine.num_nodes))  # EOS into the other value's state
    _crafted(path, mine, {}, {"edge_dests": dests})
    with pytest.raises(AutomatonFileError, match="does not spell the path"):
        TrieAutomaton.load(path, vocab=vocab)


@pytest.mark.parametrize("layout", ["trie", "dag", "regex", "lazy"])
def test_files_with_valid_checksums_and_wrong_fields_are_refused(layout: str, tmp_path: Path) -> None:
    """Every field is checked against the vocabulary and the arrays before anything is built
    or read from it: the field at fault is named; never an IndexError, a UnicodeDecodeError, a
    walk without end, or gigabytes of rows."""
    vocab = byte_vocabulary([b"get", b"_user", b"us", b"er"])
    automaton = compiled(layout)
    path = tmp_path / f"{layout}.tm"
    for field, meta, arrays in crafted_cases(automaton):
        _crafted(path, automaton, meta, arrays)
        with pytest.raises(AutomatonFileError) as raised:
            TrieAutomaton.load(path, vocab=vocab)
        assert raised.value.field == field, (field, str(raised.value))
    _crafted(path, automaton, {}, {})
    assert_equal_everywhere(automaton, TrieAutomaton.load(path, vocab=vocab))


@settings(
    max_examples=int(os.environ.get("TRIEMASK_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data(), layout=st.sampled_from(["trie", "dag", "regex", "lazy"]))
def test_any_array_changed_with_valid_checksums_loads_safely(data: st.DataObject, layout: str, tmp_path: Path) -> None:
    """A fuzz of the loader with valid checksums: random values written into any array. The
    load raises AutomatonFileError, or every method of what loaded answers without raising
    anything but a TriemaskError."""
    vocab = byte_vocabulary([b"get", b"_user", b"us", b"er"])
    automaton = compiled(layout)
    _, _, arrays = automaton.file_parts()
    name = data.draw(st.sampled_from(sorted(n for n, a in arrays.items() if len(a))))
    array = arrays[name].copy()
    info = np.iinfo(array.dtype)
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(array) - 1))
        array[at] = data.draw(st.integers(max(info.min, -5), min(info.max, 2 * automaton.num_states + 300)))
    path = tmp_path / f"fuzz-{layout}.tm"
    _crafted(path, automaton, {}, {name: array})
    try:
        loaded = TrieAutomaton.load(path, vocab=vocab)
    except AutomatonFileError:
        return
    try:
        loaded.stats()
        for state in range(loaded.num_states):
            loaded.is_accepting(state)
            loaded.allowed_token_ids(state)
        if isinstance(loaded, DagAutomaton):
            _ = [loaded.value(i) for i in range(min(loaded.num_values, 20))]
        else:
            loaded.values()
            _ = [loaded.value_of(state) for state in range(loaded.num_states)]
    except TriemaskError:
        pass


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), layout=st.sampled_from(["trie", "dag", "lazy"]))
def test_corrupt_files_are_refused_or_equal(data: st.DataObject, layout: str, tmp_path: Path) -> None:
    """A fuzz over corrupt files: flipped, overwritten, cut or appended bytes anywhere. The load
    either raises AutomatonFileError or (a change in padding) gives an automaton equal to the
    original; never another exception, never a different automaton."""
    automaton = compiled(layout)
    path = tmp_path / f"fuzz-{layout}.tm"
    automaton.save(path)
    raw = bytearray(path.read_bytes())
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
    vocab = byte_vocabulary([b"get", b"_user", b"us", b"er"])
    try:
        loaded = TrieAutomaton.load(path, vocab=vocab, mmap=data.draw(st.booleans()))
    except AutomatonFileError:
        return
    assert_equal_everywhere(automaton, loaded)


def test_two_processes_share_one_mapped_file(tmp_path: Path) -> None:
    """Two processes map one file: each loads it and gets the same masks, and the file's pages
    are shared between them (counted as shared, not private, memory in the second)."""
    path = tmp_path / "shared.tm"
    Compiler(byte_vocabulary()).compile([f"value_{i:06d}" for i in range(20_000)]).save(path)
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import numpy as np
        from conftest import byte_vocabulary
        from triemask import TrieAutomaton

        def private_kb():  # of the file's mappings only (the load's temporaries are not the file's pages)
            total, in_file = 0, False
            for line in open("/proc/self/smaps").read().splitlines():
                head = line.split()
                if len(head) > 4 and "-" in head[0] and ":" not in head[0]:
                    in_file = line.endswith({str(path)!r})
                elif in_file and head[0] in ("Private_Clean:", "Private_Dirty:"):
                    total += int(head[1])
            return total

        before = private_kb()
        automaton = TrieAutomaton.load({str(path)!r}, vocab=byte_vocabulary())
        mask = np.zeros((1, (automaton.vocab_size + 31) // 32), np.int32)
        automaton.fill_bitmask(mask, [0])
        print(private_kb() - before, int(np.count_nonzero(mask)), flush=True)
        sys.stdin.readline()
        """
    )
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    first = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=environment
    )
    assert first.stdout is not None and first.stdin is not None
    first_line = first.stdout.readline().split()
    second = subprocess.run(
        [sys.executable, "-c", script], input="\n", capture_output=True, text=True, env=environment, check=True
    )
    first.stdin.write("\n")
    first.stdin.flush()
    first.wait(timeout=60)
    private_kb, words = (int(x) for x in second.stdout.split())
    assert words == int(first_line[1]) > 0
    size_kb = path.stat().st_size // 1024
    # the first process maps the file alone (its pages are its own); the second shares them
    assert int(first_line[0]) >= size_kb // 2 > private_kb, (first_line, private_kb, size_kb)


def test_the_token_index_is_cached_on_disk(tmp_path: Path) -> None:
    """A second Compiler for the same vocabulary loads the index from the cache folder and
    compiles identically; a corrupt or foreign file is rebuilt, an unwritable folder skipped."""
    vocab = byte_vocabulary([b"get", b"_user", b"us", b"er"])
    first = Compiler(vocab, cache_dir=tmp_path)
    assert first.stats()["source"] == "built, written"
    (path,) = tmp_path.glob("token-index-*.tmi")
    assert vocab.fingerprint in path.name
    second = Compiler(vocab, cache_dir=tmp_path)
    assert second.stats()["source"] == "loaded"
    fresh = Compiler(vocab, disk_cache=False)
    assert fresh.stats()["source"] == "built"
    for layout in ("trie", "dag", "lazy"):
        assert_equal_everywhere(fresh.compile(VALUES, layout=layout), second.compile(VALUES, layout=layout))

    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    repaired = Compiler(vocab, cache_dir=tmp_path)
    assert repaired.stats()["source"].startswith("built (the cached file was not usable: ")
    assert repaired.stats()["source"].endswith(", written")
    assert Compiler(vocab, cache_dir=tmp_path).stats()["source"] == "loaded"

    other = byte_vocabulary([b"xy"])
    path.rename(tmp_path / f"token-index-{other.fingerprint}.tmi")  # a file under another's name
    assert Compiler(other, cache_dir=tmp_path).stats()["source"].startswith("built (the cached file was not usable")

    # an index of another vocabulary relabelled as this one's (valid checksums), or with an
    # array of another dtype: rebuilt, never used
    index = Compiler(other, disk_cache=False)._index
    arrays = {name: getattr(index, name) for name in index._ARRAYS}
    meta = {name: int(getattr(index, name)) for name in index._SCALARS}
    target = tmp_path / f"token-index-{vocab.fingerprint}.tmi"
    for changed in (arrays, {**arrays, "first_token": arrays["first_token"].astype(np.int64)}):
        _storage.write(target, "token_index", meta, changed, vocab_fingerprint=vocab.fingerprint, set_fingerprint="")
        source = Compiler(vocab, cache_dir=tmp_path).stats()["source"]
        assert source.startswith("built (the cached file was not usable") and source.endswith(", written")
    mine = Compiler(vocab, disk_cache=False)._index
    arrays = {name: getattr(mine, name) for name in mine._ARRAYS}
    swapped = arrays["first_token"].copy()
    a, b = np.flatnonzero(swapped >= 0)[[3, 4]]
    swapped[[a, b]] = swapped[[b, a]]  # two tokens at each other's node
    _storage.write(
        target,
        "token_index",
        {name: int(getattr(mine, name)) for name in mine._SCALARS},
        {**arrays, "first_token": swapped},
        vocab_fingerprint=vocab.fingerprint,
        set_fingerprint="",
    )
    assert "do not lead to the node" in Compiler(vocab, cache_dir=tmp_path).stats()["source"]

    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    assert Compiler(vocab, cache_dir=blocked / "sub").stats()["source"].startswith("built (cannot look at")
    assert Compiler(vocab, cache_dir=blocked).stats()["source"].startswith("built (the cache folder")


@settings(
    max_examples=int(os.environ.get("TRIEMASK_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_any_token_index_array_changed_with_valid_checksums_is_rebuilt_or_equal(
    data: st.DataObject, tmp_path: Path
) -> None:
    """The token-index loader, fuzzed with valid checksums: random values written into any of
    its arrays. The cached file is rebuilt (never an error out of Compiler), or what loaded
    compiles every layout exactly as a fresh index does."""
    vocab = byte_vocabulary([b"get", b"_user", b"us", b"er"])
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    fresh = Compiler(vocab, cache_dir=folder)
    index = fresh._index
    arrays = {name: getattr(index, name).copy() for name in index._ARRAYS}
    name = data.draw(st.sampled_from(sorted(arrays)))
    array = arrays[name]
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(array) - 1))
        array[at] = (
            data.draw(st.booleans())
            if array.dtype == np.bool_
            else data.draw(st.integers(0, min(int(np.iinfo(array.dtype).max), index.num_nodes + 300)))
        )
    meta = {key: int(getattr(index, key)) for key in index._SCALARS}
    path = folder / f"token-index-{vocab.fingerprint}.tmi"
    _storage.write(path, "token_index", meta, arrays, vocab_fingerprint=vocab.fingerprint, set_fingerprint="")
    loaded = Compiler(vocab, cache_dir=folder)
    assert loaded.stats()["source"] in ("loaded",) or loaded.stats()["source"].startswith("built (the cached file")
    reference = Compiler(vocab, disk_cache=False)
    for layout in ("trie", "dag", "lazy"):
        assert_equal_everywhere(reference.compile(VALUES, layout=layout), loaded.compile(VALUES, layout=layout))


def test_cache_folders_others_can_write_into_are_not_used(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A folder writable by others, or owned by another user, could hold a file anyone put
    there: it is not used (one warning each); one the process cannot write is skipped."""
    vocab = byte_vocabulary([b"get", b"_user", b"us", b"er"])
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    with caplog.at_level("WARNING", logger="triemask"):
        for _ in range(2):
            assert "others may write into it (mode 1777)" in Compiler(vocab, cache_dir=shared).stats()["source"]
            assert CompileCache(directory=shared).stats()["directory"] is None
    assert len([r for r in caplog.records if "does not use the cache folder" in r.getMessage()]) == 1
    assert not list(shared.iterdir())
    if os.geteuid() == 0:  # root can give a folder away
        foreign = tmp_path / "foreign"
        foreign.mkdir()
        os.chown(foreign, 12345, 12345)
        assert "owned by user 12345" in Compiler(vocab, cache_dir=foreign).stats()["source"]
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    assert Compiler(vocab, cache_dir=private).stats()["source"] == "built, written"


def test_a_header_and_fields_naming_different_vocabularies_are_refused(tmp_path: Path) -> None:
    from triemask.automata.trie import restore_stored
    from triemask.base import storage as _storage

    path = tmp_path / "set.tm"
    compiled("trie").save(path)
    _rewrite_header(path, {"vocab_fingerprint": "0" * 32})  # checksums valid, the fields disagree
    with pytest.raises(AutomatonFileError, match="its fields name another vocabulary than its header") as raised:
        restore_stored(_storage.read(path, kinds=("trie",)))
    assert raised.value.field == "header"


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 31, 32, 33, 4099, 70_001])
def test_the_checksum_is_the_reference_and_catches_every_word(size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The C checksum equals the NumPy reference at every length (tails included), and a
    change anywhere in the bytes changes it."""
    from triemask.base import kernels as kernels

    data = bytearray(np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes())
    native = checksum(data)
    monkeypatch.setattr(kernels, "KERNELS", None)
    assert checksum(data) == native
    monkeypatch.undo()
    for at in range(0, size, max(1, size // 37)):
        data[at] ^= 1 << (at % 8)
        assert checksum(data) != native, at
        data[at] ^= 1 << (at % 8)
    assert checksum(data + b"\0") != native  # the length is mixed in: a padding byte is a change


def test_a_failed_verification_waits_for_every_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """A corrupt first piece is reported only once every piece's check has ended: the caller
    may then cut or rewrite the mapped file, and a check still reading it would kill the
    process (SIGBUS) instead of raising. (Seen in CI: a hypothesis example rewrote the file
    of the previous example, whose later pieces were still being checked.)"""
    import time

    monkeypatch.setattr(_storage, "_CHUNK", 8)
    array = np.arange(32, dtype=np.uint8)  # four pieces
    sums = [checksum(array[i : i + 8]) for i in range(0, 32, 8)]
    ended: list[int] = []

    def slow_checksum(piece: memoryview) -> int:
        if piece[0] != 0:  # every piece but the first (the corrupt one) takes its time
            time.sleep(0.2)
        found = checksum(piece)
        ended.append(piece[0])
        return found

    monkeypatch.setattr(_storage, "checksum", slow_checksum)
    stored = _storage.Stored({"arrays": {"a": {"checksums": [sums[0] ^ 1, *sums[1:]]}}}, {"a": array}, "file 'x'")
    wait = stored.verify_in_background()
    with pytest.raises(AutomatonFileError, match="array 'a' fails its checksum"):
        wait()
    assert sorted(ended) == [0, 8, 16, 24]
