"""The measurements: decoding paths, per-step and batch mask cost, the mask cross-check,
and compile sweeps run in a child process under a timeout."""

from __future__ import annotations

import gc
import json
import os
import random
import resource
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from triemask import LazyTrieAutomaton, TrieAutomaton, Vocabulary

from .peers import Engine, Request


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


# --- realistic decoding states ----------------------------------------------------------------


def decoding_paths(
    automaton: TrieAutomaton, vocab: Vocabulary, values: list[str], n: int, seed: int
) -> list[list[int]]:
    """Token paths that decode ``n`` sampled values, each followed by EOS.

    At every state the path takes the allowed token covering the longest piece of the
    rest of the value, as BPE tokenizations mostly do, so the states met are those a
    model meets when it writes the value the usual way.
    """
    eos = vocab.eos_token_ids[0]
    paths = []
    for value in random.Random(seed).sample(values, min(n, len(values))):
        target, position, state, path = value.encode(), 0, automaton.initial_state, []
        while position < len(target):
            best, best_length = -1, 0
            for token in automaton.allowed_token_ids(state).tolist():
                piece = vocab.token_bytes(token) or b""
                if len(piece) > best_length and target.startswith(piece, position):
                    best, best_length = token, len(piece)
            path.append(best)
            state = automaton.next_state(state, best)
            position += best_length
        paths.append([*path, eos])
    return paths


def per_step_seconds(
    engine: Engine, compiled: Any, paths: list[list[int]], repeats: int, request: Request | None = None
) -> float:
    """Mean cost of one decoding step (write the mask row, advance by the token) along the
    paths, through ``request`` (default: the engine's own)."""
    request = engine.request(compiled) if request is None else request
    bitmask = np.zeros((1, engine.width), dtype=np.int32)
    steps = sum(map(len, paths))
    totals = []
    for _ in range(repeats):
        total = 0.0
        for path in paths:
            request.reset()
            start = time.perf_counter()
            for token in path:
                request.fill(bitmask, 0)
                request.advance(token)
            total += time.perf_counter() - start
        totals.append(total / steps)
    return statistics.median(totals)


def batch_step_seconds(
    engine: Engine, compiled: Any, paths: list[list[int]], batch: int, steps: int, repeats: int
) -> dict[str, float]:
    """Cost of one batch step: fill B rows from B requests, then advance each by its token.

    Row i decodes path i mod P, starting i // P tokens in, so rows sit at different
    depths; a row that finished its value restarts (outside the timed region).
    """
    requests = [engine.request(compiled) for _ in range(batch)]
    cursor = []
    for i, request in enumerate(requests):
        path = paths[i % len(paths)]
        offset = (i // len(paths)) % len(path)
        for token in path[:offset]:
            request.advance(token)
        cursor.append([i % len(paths), offset])
    bitmask = np.zeros((batch, engine.width), dtype=np.int32)
    fill_times, step_times = [], []
    for _ in range(repeats):
        fill_total = step_total = 0.0
        for _ in range(steps):
            tokens = [paths[p][o] for p, o in cursor]
            start = time.perf_counter()
            engine.batch_fill(requests, bitmask)
            middle = time.perf_counter()
            engine.batch_advance(requests, tokens)
            end = time.perf_counter()
            fill_total += middle - start
            step_total += end - start
            for row, entry in enumerate(cursor):
                entry[1] += 1
                if entry[1] == len(paths[entry[0]]):
                    requests[row].reset()
                    entry[1] = 0
        fill_times.append(fill_total / steps)
        step_times.append(step_total / steps)
    return {"fill_s": statistics.median(fill_times), "step_s": statistics.median(step_times)}


def cross_check(
    reference: Engine, ours: Any, engine: Engine, theirs: Any, paths: list[list[int]], values: list[str], limit: int = 5
) -> dict[str, Any]:
    """Compare the allowed sets of two engines at every state along the paths."""
    mine, other = reference.request(ours), engine.request(theirs)
    row_a = np.zeros((1, reference.width), dtype=np.int32)
    row_b = np.zeros((1, engine.width), dtype=np.int32)
    states = subset = 0
    disagreements: list[dict[str, Any]] = []
    for path in paths:
        mine.reset()
        other.reset()
        for step, token in enumerate(path):
            mine.fill(row_a, 0)
            other.fill(row_b, 0)
            states += 1
            if not np.array_equal(row_a, row_b):
                a = set(np.flatnonzero(np.unpackbits(row_a.view(np.uint8), bitorder="little")).tolist())
                b = set(np.flatnonzero(np.unpackbits(row_b.view(np.uint8), bitorder="little")).tolist())
                subset += b < a
                if len(disagreements) < limit:
                    disagreements.append(
                        {
                            "path": path[:step],
                            "text": reference.vocab.decode(path[:step]).decode("utf-8", "replace"),
                            "only_triemask": sorted(a - b)[:20],
                            "only_peer": sorted(b - a)[:20],
                        }
                    )
                else:
                    disagreements.append({})
            mine.advance(token)
            other.advance(token)
    return {
        "states": states,
        "disagreements": len(disagreements),
        # states where the peer allows a strict subset of triemask's tokens (llguidance's forced-byte fast path)
        "peer_strict_subset": subset,
        "examples": [d for d in disagreements if d],
    }


# --- compile sweeps in a child process ---------------------------------------------------------


def compile_sweep(
    engine: str,
    vocabulary: str,
    value_set: str,
    sizes: list[int],
    timeout: float,
    repeat_budget: float = 3.0,
    decode: bool = False,
    layout: str | None = None,
) -> dict[str, Any]:
    """Compile times for every K, in a fresh process, each compile under ``timeout`` seconds.

    A K whose first compile does not finish in time is recorded as ``"timeout"``, and so
    are the larger K (compile time grows with K for every engine measured here). With
    ``decode`` (triemask), the child also measures a step and a 128-row batch fill on
    the compiled set. ``layout`` (triemask): the ``compile(layout=...)`` to measure.
    """
    request = {
        "engine": engine,
        "vocab": vocabulary,
        "set": value_set,
        "sizes": sizes,
        "budget": repeat_budget,
        "decode": decode,
        **({"layout": layout} if layout else {}),
    }
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.worker", json.dumps(request)],
        stdout=subprocess.PIPE,
        bufsize=0,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert child.stdout is not None
    lines = _LineReader(child.stdout.fileno())
    result: dict[str, Any] = {"engine": engine, "vocab": vocabulary, "set": value_set, "sizes": {}}
    pending = list(sizes)
    wait = timeout + 120  # start-up: imports, vocabulary, tokenizer preparation
    try:
        while pending:
            line = lines.next(wait)
            if line is None:  # timed out (or the child died)
                break
            message = json.loads(line)
            if "prepare_s" in message:
                result.update(message)
                wait = timeout
            elif message.get("phase") == "first":  # the repeats of this K follow
                wait = max(repeat_budget, message["first_s"]) * 2 + 10
                if decode:  # the decode figures (with layout="lazy", an eager compile too: up to 5x longer)
                    wait += 60 + 10 * message["first_s"]
            else:
                k = message.pop("k")
                result["sizes"][str(k)] = message
                pending.remove(k)
                wait = timeout
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    for k in pending:
        result["sizes"][str(k)] = {"status": "timeout", "timeout_s": timeout}
    return result


class _LineReader:
    """Lines from a pipe with a timeout: select() on the descriptor and our own buffer
    (a buffered file object may hold a whole line that select() cannot see)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""

    def next(self, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.fd], [], [], remaining)[0]:
                return None
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()


def run_worker(request: dict[str, Any]) -> None:
    """The child side of :func:`compile_sweep`: prints one JSON line per event."""
    from . import sets, vocabs
    from .peers import ENGINES

    def emit(message: dict[str, Any]) -> None:
        print(json.dumps(message), flush=True)

    loaded = vocabs.load(request["vocab"])
    start = time.perf_counter()
    engine = ENGINES[request["engine"]](loaded.vocab)
    if "layout" in request:
        engine.layout = request["layout"]
    emit({"prepare_s": time.perf_counter() - start, "rss_after_prepare": rss_bytes()})
    for k in request["sizes"]:
        values = sets.load(request["set"], k)
        gc.collect()
        before = rss_bytes()
        start = time.perf_counter()
        try:
            compiled = engine.compile(values)
        except BaseException as error:
            lines = str(error).strip().splitlines()
            emit({"k": k, "status": "error", "error": f"{type(error).__name__}: {lines[0][:200] if lines else ''}"})
            continue
        first = time.perf_counter() - start
        rss_delta = rss_bytes() - before
        peak_delta = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before  # ru_maxrss: KiB on Linux
        emit({"phase": "first", "first_s": first})
        runs = [engine_compile_seconds(engine, values) for _ in range(min(7, int(request["budget"] / first)))]
        message = {
            "k": k,
            "status": "ok",
            "values": len(values),
            "input_bytes": sum(map(len, (v.encode() for v in values))),
            "first_s": first,
            "compile_s": statistics.median(runs) if runs else first,
            "runs": len(runs) or 1,
            "rss_delta_bytes": rss_delta,
            "peak_rss_delta_bytes": max(0, peak_delta),
            "memory_bytes": engine.memory_bytes(compiled),
        }
        if request.get("decode"):
            message.update(_decode_figures(engine, compiled, loaded.vocab, values))
        emit(message)
        del compiled


def _decode_figures(engine: Any, automaton: TrieAutomaton, vocab: Vocabulary, values: list[str]) -> dict[str, Any]:
    """A step (through Matcher and through the stateless API) and a 128-row batch fill; for
    the lazy layout, first the cold step (the cache emptied before each value) and, after
    the warm figures, the cache's use."""
    lazy = isinstance(automaton, LazyTrieAutomaton)
    if lazy:
        automaton.cache_clear()
        start = time.perf_counter()
        automaton.allowed_token_ids(automaton.initial_state)
        root_s = time.perf_counter() - start
    paths = decoding_paths(automaton, vocab, values, 32, seed=0)
    figures: dict[str, Any] = {}
    if lazy:
        request = engine.matcher_request(automaton)
        bitmask = np.zeros((1, engine.width), dtype=np.int32)
        total, steps = 0.0, 0
        for path in paths:
            automaton.cache_clear()
            request.reset()
            start = time.perf_counter()
            for token in path:
                request.fill(bitmask, 0)
                request.advance(token)
            total += time.perf_counter() - start
            steps += len(path)
        figures.update(per_step_cold_s=total / steps, root_cold_s=root_s)
        decoding_paths(automaton, vocab, values, 32, seed=0)  # the paths' nodes cached again
    stats = automaton.stats()
    figures.update(
        nodes=stats["trie_nodes"],
        edges=stats.get("edges"),
        per_step_s=per_step_seconds(engine, automaton, paths, 9, engine.matcher_request(automaton)),
        per_step_stateless_s=per_step_seconds(engine, automaton, paths, 9),
        batch_fill_128_s=batch_step_seconds(engine, automaton, paths, 128, 20, 3)["fill_s"],
    )
    if lazy:
        figures.update(cache=automaton.cache_info(), memory_bytes_after=automaton.memory_bytes)
        # the warm step against the eager layout's in this process, alternating (this VM's
        # timings drift between processes by more than the difference measured)
        eager = engine.compiler.compile(values)
        rounds = [
            (
                per_step_seconds(engine, eager, paths, 1, engine.matcher_request(eager)),
                per_step_seconds(engine, automaton, paths, 1, engine.matcher_request(automaton)),
            )
            for _ in range(15)
        ]
        figures["paired_step_s"] = {
            "trie": statistics.median(r[0] for r in rounds),
            "lazy": statistics.median(r[1] for r in rounds),
        }
    return figures


def engine_compile_seconds(engine: Engine, values: list[str]) -> float:
    start = time.perf_counter()
    engine.compile(values)
    return time.perf_counter() - start
