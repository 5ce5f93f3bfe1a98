"""The core compile cache: one entry per set (any order, any duplicates), bounded in bytes,
thread-safe, with an optional disk tier."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import byte_vocabulary
from triemask import CompileCache, Compiler, LazyTrieAutomaton, ValueSetError, values_fingerprint


@pytest.fixture
def compiler() -> Compiler:
    return Compiler(byte_vocabulary(), disk_cache=False)


def test_one_entry_per_set_whatever_the_order_or_duplicates(compiler: Compiler) -> None:
    cache = CompileCache()
    first = cache.compile(compiler, ["b", "a", "c"])
    assert cache.stats()["bytes"] == first.memory_bytes
    assert cache.compile(compiler, ["c", "a", "b", "a"]) is first
    assert cache.compile(compiler, ("a", "b", "c")) is first
    assert cache.compile(compiler, iter(["a", "c", "b"])) is first
    assert values_fingerprint(["c", "b", "a", "a"]) == first.set_fingerprint
    assert cache.compile(compiler, ["a", "b"]) is not first
    assert cache.compile(compiler, ["a", "b", "c"], eos=False) is not first  # other options: other entries
    lazy = cache.compile(compiler, ["a", "b", "c"], layout="lazy")
    assert isinstance(lazy, LazyTrieAutomaton) and lazy.set_fingerprint == first.set_fingerprint
    assert cache.compile(compiler, [b"a", b"b", b"c"]) is not first  # bytes are another set
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["entries"]) == (3, 5, 5)
    other = Compiler(byte_vocabulary([b"ab"]), disk_cache=False)
    assert cache.compile(other, ["a", "b", "c"]) is not first  # another vocabulary


def test_errors_are_the_compilers(compiler: Compiler) -> None:
    cache = CompileCache()
    with pytest.raises(ValueSetError, match="empty"):
        cache.compile(compiler, [])
    with pytest.raises(ValueSetError, match=r"all str or all bytes; value #1 is bytes: b.b."):
        cache.compile(compiler, ["a", b"b"])  # type: ignore[list-item]
    with pytest.raises(ValueSetError, match="value #1 is int: 3"):
        cache.compile(compiler, ["a", 3])  # type: ignore[list-item]
    with pytest.raises(ValueSetError, match="non-negative"):
        CompileCache(-1)
    assert cache.stats()["entries"] == 0


def test_bounded_in_bytes_and_a_set_larger_than_the_bound_is_not_kept(compiler: Compiler) -> None:
    sizes = {k: compiler.compile([f"value{i}" for i in range(k)]).memory_bytes for k in (10, 20)}
    cache = CompileCache(max_bytes=sizes[10] + sizes[20] // 2)
    a = cache.compile(compiler, [f"value{i}" for i in range(10)])
    b = cache.compile(compiler, [f"value{i}" for i in range(20)])  # evicts a
    stats = cache.stats()
    assert stats["entries"] == 1 and stats["evictions"] == 1 and stats["bytes"] == b.memory_bytes <= stats["max_bytes"]
    assert cache.compile(compiler, [f"value{i}" for i in range(20)]) is b
    assert cache.compile(compiler, [f"value{i}" for i in range(10)]) is not a  # compiled again
    huge = [f"value{i}" for i in range(2000)]
    big = cache.compile(compiler, huge)
    assert cache.stats()["not_kept"] == 1 and cache.compile(compiler, huge) is not big
    assert cache.stats()["bytes"] <= cache.max_bytes
    cache.clear()
    assert len(cache) == 0 and cache.stats()["bytes"] == 0


def test_threads_asking_for_one_set_compile_it_once(compiler: Compiler) -> None:
    cache = CompileCache()
    builds = []

    def build() -> str:
        builds.append(1)
        time.sleep(0.05)
        return "built"

    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(cache.get("k", build, len))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == ["built"] * 8 and len(builds) == 1
    stats = cache.stats()
    assert stats["misses"] == 1 and stats["hits"] == 7

    def failing() -> str:
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        cache.get("bad", failing, len)
    with pytest.raises(RuntimeError):  # a failure is not cached as an entry: it is tried again
        cache.get("bad", failing, len)


def test_the_disk_tier_serves_a_fresh_cache(compiler: Compiler, tmp_path: Path) -> None:
    values = [f"tool_{i}" for i in range(300)]
    first = CompileCache(directory=tmp_path)
    automaton = first.compile(compiler, values)
    assert first.stats()["disk_writes"] == 1 and len(list(tmp_path.glob("set-*.tm"))) == 1
    second = CompileCache(directory=tmp_path)  # another process, say
    loaded = second.compile(compiler, list(reversed(values)))
    assert second.stats()["disk_hits"] == 1 and loaded is not automaton
    mask_a, mask_b = (np.zeros((1, (compiler.vocab.vocab_size + 31) // 32), np.int32) for _ in range(2))
    for state in range(0, automaton.num_states, 7):
        automaton.fill_bitmask(mask_a, [state])
        loaded.fill_bitmask(mask_b, [state])
        assert np.array_equal(mask_a, mask_b)
    (path,) = tmp_path.glob("set-*.tm")
    path.write_bytes(path.read_bytes()[:100])  # a corrupt file is compiled again and replaced
    third = CompileCache(directory=tmp_path)
    third.compile(compiler, values)
    assert third.stats()["disk_hits"] == 0 and third.stats()["disk_writes"] == 1
    small = CompileCache(directory=tmp_path, max_disk_bytes=path.stat().st_size + 10)
    small.compile(compiler, values[:100])  # the disk tier keeps to its bound: the older file goes
    assert sum(p.stat().st_size for p in tmp_path.glob("set-*.tm")) <= small.max_disk_bytes
    small.clear(disk=True)
    assert not list(tmp_path.glob("set-*.tm"))
