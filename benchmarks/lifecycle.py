"""Sets that live: saving, loading and sharing automata, the token-index cache, updates.

    python -m benchmarks lifecycle [--k 100000] [--out benchmarks/results]

On Qwen2.5's vocabulary and K synthetic tool names (default 100,000), each figure a median:

* ``save`` and ``TrieAutomaton.load`` of the compiled set (memory-mapped, with and without
  the checksums), and the private memory a second process adds when it maps the file
  another process has mapped (``/proc/self/smaps_rollup``);
* a ``Compiler`` for Qwen2.5 built in a fresh process from the on-disk token index;
* ``with_values(added=100, removed=100)`` against recompiling the new set (its first call in
  the process, then the median), the masks of the two compared on the states of 500 decoded
  values, a step through each (half the walks along added values, which extend base ones) and
  a batch fill of 128 of those states; then 1,000 + 1,000 on 1,000,000 values (``--large-k``);
* a JSON schema with a 10,000-value enum field: compiled, against loaded from its file.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np

from triemask import CompiledSchema, Compiler, Matcher, TrieAutomaton
from triemask.datasets import synthetic_tools

from . import vocabs


def _median_seconds(call: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


_CHILD = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, {root!r})
    from benchmarks import vocabs
    vocab = vocabs.load("qwen2.5").vocab

    def private_kb():
        fields = dict(line.split(":", 1) for line in open("/proc/self/smaps_rollup").read().splitlines()[1:])
        return sum(int(fields[k].split()[0]) for k in ("Private_Clean", "Private_Dirty"))

    from triemask import Compiler, TrieAutomaton
    started = time.perf_counter()
    compiler = Compiler(vocab)
    index_s = time.perf_counter() - started
    TrieAutomaton.load({path!r}, vocab=vocab)  # the code paths warmed on another object
    before = private_kb()
    started = time.perf_counter()
    automaton = TrieAutomaton.load({path!r}, vocab=vocab)
    load_s = time.perf_counter() - started
    import numpy as np
    mask = np.zeros((64, (automaton.vocab_size + 31) // 32), np.int32)
    automaton.fill_bitmask(mask, list(range(64)))
    print(json.dumps({{"index_s": index_s, "index_source": compiler.stats()["source"], "load_s": load_s,
                       "private_kb": private_kb() - before}}), flush=True)
    sys.stdin.readline()
    """
)


def processes(path: Path) -> list[dict[str, Any]]:
    """Two processes mapping the file at once: what each adds privately, and how fast each
    builds its Compiler (the second from the index the first left on disk)."""
    script = _CHILD.format(root=str(Path(__file__).resolve().parent.parent), path=str(path))
    first = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert first.stdout is not None and first.stdin is not None
    results = [json.loads(first.stdout.readline())]
    second = subprocess.run([sys.executable, "-c", script], input="\n", capture_output=True, text=True, check=True)
    results.append(json.loads(second.stdout))
    first.stdin.write("\n")
    first.stdin.flush()
    first.wait(timeout=120)
    return results


def schema_files(compiler: Compiler, names: list[str], scratch: Path) -> dict[str, Any]:
    """A JSON schema with an enum field of ``names``: compiling it against loading it saved
    (both after a first compile, which builds the vocabulary's per-process schema support)."""
    schema = {
        "type": "object",
        "properties": {"tool": {"enum": names}, "arguments": {"type": "object"}},
        "required": ["tool", "arguments"],
    }
    compiled = compiler.compile_json_schema(schema)  # and the vocabulary's support, built once
    path = scratch / "schema.tm"
    compiled.save(path)
    return {
        "schema_values": len(names),
        "schema_compile_s": _median_seconds(lambda: compiler.compile_json_schema(schema), 5),
        "schema_file_bytes": path.stat().st_size,
        "schema_load_s": _median_seconds(lambda: CompiledSchema.load(path, vocab=compiler), 9),
    }


def byte_paths(compiler: Compiler, values: list[str]) -> list[list[int]]:
    """Byte-token paths of the values (every byte is a token in Qwen's vocabulary)."""
    byte_tokens = compiler.single_byte_tokens()
    return [[int(byte_tokens[b]) for b in value.encode()] for value in values]


def updates(compiler: Compiler, automaton: TrieAutomaton, values: list[str], change: int) -> dict[str, Any]:
    """``with_values(added=change, removed=change)`` on ``automaton`` (the set ``values``)
    against recompiling the new set: its first call on this automaton (CPython's garbage
    collections during it timed apart), the median, the masks of the two on the states of 500
    decoded values, a step through each (half the walks along added values, which extend base
    ones; the two interleaved, 15 times) and a batch fill of 128 of those states."""
    rng = random.Random(0)
    removed = rng.sample(values, change)
    added = [f"{v}_v2" for v in rng.sample(values, change)]
    new_set = sorted((set(values) - set(removed)) | set(added))
    collecting: list[float] = []  # CPython's garbage collections during the first call, timed

    def collection(phase: str, info: dict[str, Any]) -> None:
        collecting.append(time.perf_counter() * (-1 if phase == "start" else 1))

    gc.callbacks.append(collection)
    started = time.perf_counter()
    automaton.with_values(added=added, removed=removed)
    found: dict[str, Any] = {"k": len(values), "change": change, "update_first_s": time.perf_counter() - started}
    gc.callbacks.remove(collection)
    found["update_first_gc_s"] = sum(collecting) if len(collecting) % 2 == 0 else 0.0
    found["recompile_s"] = _median_seconds(lambda: compiler.compile(new_set), 5)
    found["update_s"] = _median_seconds(lambda: automaton.with_values(added=added, removed=removed), 9)
    updated = automaton.with_values(added=added, removed=removed)
    fresh = compiler.compile(new_set)
    checked = differences = 0
    for path_tokens in byte_paths(compiler, rng.sample(new_set, 450) + removed[:50]):
        u, f = updated.initial_state, fresh.initial_state
        for token in path_tokens:
            checked += 1
            differences += not np.array_equal(updated.allowed_token_ids(u), fresh.allowed_token_ids(f))
            u, f = updated.next_state(u, token), fresh.next_state(f, token)
            if f < 0:
                differences += u >= 0
                break
    found["update_states_checked"], found["update_mask_differences"] = checked, differences
    paths = byte_paths(compiler, rng.sample(new_set, 32) + rng.sample(added, 32))
    bitmask = np.zeros((1, (compiler.vocab.vocab_size + 31) // 32), dtype=np.int32)

    def steps(target: TrieAutomaton) -> float:
        total = count = 0.0
        for tokens in paths:
            matcher = Matcher(target)
            started = time.perf_counter()
            for token in tokens:
                matcher.fill_next_token_bitmask(bitmask)
                matcher.accept_token(token)
            total += time.perf_counter() - started
            count += len(tokens)
        return total / count

    timed: dict[str, list[float]] = {"fresh": [], "updated": []}
    for _ in range(15):  # (interleaved: a slower spell of the machine hits both)
        timed["fresh"].append(steps(fresh))
        timed["updated"].append(steps(updated))
    found["step_fresh_s"], found["step_updated_s"] = (statistics.median(timed[name]) for name in ("fresh", "updated"))
    batch = np.zeros((128, bitmask.shape[1]), dtype=np.int32)
    for name, target in (("fresh", fresh), ("updated", updated)):
        walked = []  # the states along the walks, 128 of them as a batch
        for tokens in paths:
            state = target.initial_state
            for token in tokens:
                walked.append(state)
                state = target.next_state(state, token)
        states = np.asarray(walked[:: max(1, len(walked) // 128)][:128], dtype=np.int64)
        found[f"batch_{name}_s"] = _median_seconds(lambda t=target, s=states: t.fill_bitmask(batch, s), 51)
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks lifecycle", description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=100_000)
    parser.add_argument("--large-k", type=int, default=1_000_000, help="the updates again on this many (0: not)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["TRIEMASK_CACHE"] = str(Path(scratch) / "cache")
        vocab = vocabs.load("qwen2.5").vocab
        compiler = Compiler(vocab)
        values = synthetic_tools(options.k)
        automaton = compiler.compile(values)
        path = Path(scratch) / "set.tm"
        results: dict[str, Any] = {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "k": options.k,
            "automaton_bytes": automaton.memory_bytes,
            "save_s": _median_seconds(lambda: automaton.save(path), 5),
            "file_bytes": path.stat().st_size,
            "load_verified_s": _median_seconds(lambda: TrieAutomaton.load(path, vocab=vocab), 9),
            "load_unverified_s": _median_seconds(lambda: TrieAutomaton.load(path, vocab=vocab, verify=False), 9),
            "load_read_s": _median_seconds(lambda: TrieAutomaton.load(path, vocab=vocab, mmap=False), 9),
        }
        results["processes"] = processes(path)

        results["updates"] = [updates(compiler, automaton, values, 100)]
        if options.large_k:
            large = synthetic_tools(options.large_k)
            results["updates"].append(updates(compiler, compiler.compile(large), large, options.large_k // 1000))
        results.update(schema_files(compiler, values[:10_000], Path(scratch)))
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "lifecycle.json").write_text(json.dumps(results, indent=1) + "\n")
    (options.out / "lifecycle.md").write_text(markdown(results))
    print(markdown(results))


def _update_lines(u: dict[str, Any]) -> list[str]:
    on = f"{u['change']:,} + {u['change']:,} on {u['k']:,}"
    return [
        f"| {on}: recompile the new set | {u['recompile_s'] * 1e3:.1f} ms |",
        f"| {on}: `with_values`, first call on the automaton / median | "
        f"{u['update_first_s'] * 1e3:.2f} ms ({u['recompile_s'] / u['update_first_s']:.0f}x faster) / "
        f"{u['update_s'] * 1e3:.2f} ms ({u['recompile_s'] / u['update_s']:.0f}x faster) |",
        f"| {on}: of the first call, CPython's garbage collection during it | {u['update_first_gc_s'] * 1e3:.2f} ms |",
        f"| {on}: mask differences, updated vs recompiled | {u['update_mask_differences']} of "
        f"{u['update_states_checked']:,} states |",
        f"| {on}: step (Matcher), recompiled / updated | {u['step_fresh_s'] * 1e6:.2f} us / "
        f"{u['step_updated_s'] * 1e6:.2f} us ({u['step_updated_s'] / u['step_fresh_s']:.2f}x) |",
        f"| {on}: batch fill of 128 states, recompiled / updated | {u['batch_fresh_s'] * 1e6:.1f} us / "
        f"{u['batch_updated_s'] * 1e6:.1f} us ({u['batch_updated_s'] / u['batch_fresh_s']:.2f}x) |",
    ]


def markdown(r: dict[str, Any]) -> str:
    first, second = r["processes"]
    return "\n".join(
        [
            f"# Sets that live ({r['date']}; Qwen2.5, {r['k']:,} synthetic tools)",
            "",
            "| what | figure |",
            "|---|---:|",
            f"| automaton / file | {r['automaton_bytes'] / 1e6:.1f} MB / {r['file_bytes'] / 1e6:.1f} MB |",
            f"| save | {r['save_s'] * 1e3:.1f} ms |",
            f"| load, mmap, verified (checksums) | {r['load_verified_s'] * 1e3:.2f} ms |",
            f"| load, mmap, unverified | {r['load_unverified_s'] * 1e3:.2f} ms |",
            f"| load, read into memory, verified | {r['load_read_s'] * 1e3:.2f} ms |",
            f"| private memory added by loading: first process / second | {first['private_kb']:,} kB / "
            f"{second['private_kb']:,} kB |",
            f"| Compiler for Qwen2.5: first process ({first['index_source']}) / second ({second['index_source']}) | "
            f"{first['index_s'] * 1e3:.0f} ms / {second['index_s'] * 1e3:.0f} ms |",
            *(line for u in r["updates"] for line in _update_lines(u)),
            f"| JSON schema with a {r['schema_values']:,}-value enum: compile / load its "
            f"{r['schema_file_bytes'] / 1e6:.1f} MB file | {r['schema_compile_s'] * 1e3:.1f} ms / "
            f"{r['schema_load_s'] * 1e3:.1f} ms |",
            "",
        ]
    )
