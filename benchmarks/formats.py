"""Fixed formats (paper Table 17) and real-world finite patterns: triemask's compile_regex
against xgrammar's and llguidance's compile of the same regex, on the nine vocabularies.

    python -m benchmarks formats [--quick] [--out benchmarks/results] [--vocabularies ...]

For each vocabulary, each built-in format (``triemask.FORMATS``: date, time, date-time,
uuid, ipv4, ipv6) and each pattern of ``REAL_WORLD`` (phone numbers, ISO codes, ZIP, ICD-10-CM,
semver, identifiers), all in this process:

* compile: triemask *cold* (the pattern's automaton built too: the first compile of
  a pattern in a process) and *warm* (pattern automaton cached, as every later
  compile of the pattern, on any vocabulary), in the eager layout (every state's edges) and
  the lazy one (``layout="lazy"``, cold, to the first mask); xgrammar ``compile_regex`` with
  its cache off plus the first mask; llguidance ``grammar_from_regex`` plus matcher plus first
  mask (it is lazy). Median of the repeats;
* per step: fill one bitmask row + advance by the token, along random walks
  (triemask ``fill_bitmask`` + ``next_state``; xgrammar ``GrammarMatcher``),
  with triemask's per step on a 1,000-value set as the yardstick;
* masks compared with xgrammar's at every state of the walks.

Then the two layouts of a *set* on Qwen2.5 (``compile(values, layout="trie" | "dag")``:
the trie, or the set's minimal acyclic automaton with shared suffixes merged) on
ICD-10-CM and synthetic tools up to 1,000,000: compile time, memory, per step and a
128-row batch fill.

The per-vocabulary preparation (triemask's token index, xgrammar's TokenizerInfo,
llguidance's tokenizer) is done once, outside the timings, for every engine.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from triemask import FORMATS, Compiler, TrieAutomaton, allocate_token_bitmask
from triemask.datasets import synthetic_tools

from . import vocabs
from .measure import median_seconds
from .peers import LLGuidanceEngine, _encoded_vocabulary


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _walks(automaton: TrieAutomaton, count: int, seed: int) -> list[list[int]]:
    """Random token paths to a final state (uniform among the allowed tokens)."""
    rng = random.Random(seed)
    paths = []
    for _ in range(count):
        state, path = automaton.initial_state, []
        while not automaton.is_final(state):
            token = rng.choice(automaton.allowed_token_ids(state).tolist())
            path.append(token)
            state = automaton.next_state(state, token)
        paths.append(path)
    return paths


def _triemask_step(automaton: TrieAutomaton, paths: list[list[int]], bitmask: np.ndarray, repeats: int) -> float:
    steps = sum(map(len, paths))
    totals = []
    for _ in range(repeats):
        start = time.perf_counter()
        for path in paths:
            state = automaton.initial_state
            for token in path:
                automaton.fill_bitmask(bitmask, (state,))
                state = automaton.next_state(state, token)
        totals.append((time.perf_counter() - start) / steps)
    return statistics.median(totals)


def _xgrammar_step(xgr: Any, compiled: Any, paths: list[list[int]], bitmask: Any, repeats: int) -> float:
    steps = sum(map(len, paths))
    totals = []
    matcher = xgr.GrammarMatcher(compiled)
    for _ in range(repeats):
        total = 0.0
        for path in paths:
            matcher.reset()
            start = time.perf_counter()
            for token in path:
                matcher.fill_next_token_bitmask(bitmask)
                matcher.accept_token(token)
            total += time.perf_counter() - start
        totals.append(total / steps)
    return statistics.median(totals)


def _differences(xgr: Any, automaton: TrieAutomaton, compiled: Any, paths: list[list[int]]) -> tuple[int, int]:
    """(states compared, states whose masks differ) along the paths."""
    mine = allocate_token_bitmask(1, automaton.vocab_size)
    theirs = xgr.allocate_token_bitmask(1, automaton.vocab_size).numpy()
    compared = differing = 0
    for path in paths:
        matcher, state = xgr.GrammarMatcher(compiled), automaton.initial_state
        for token in path:
            automaton.fill_bitmask(mine, (state,))
            matcher.fill_next_token_bitmask(theirs)
            compared += 1
            differing += int(not np.array_equal(mine, theirs))
            if not matcher.accept_token(token):
                differing += 1
                break
            state = automaton.next_state(state, token)
    return compared, differing


# Real-world finite patterns (issue 29): bounded, with classes and repeats, as schemas write them.
REAL_WORLD = {
    "phone-e164": r"\+[1-9][0-9]{6,14}",
    "phone-us": r"\(?[0-9]{3}\)?[-. ]?[0-9]{3}[-. ]?[0-9]{4}",
    "iso-3166-alpha2": "[A-Z]{2}",
    "iso-4217": "[A-Z]{3}",
    "zip+4": "[0-9]{5}(-[0-9]{4})?",
    "icd-10-cm": r"[A-TV-Z][0-9][0-9AB](\.[0-9A-Z]{1,4})?",
    "semver": r"(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})(-[0-9A-Za-z-]{1,20})?",
    "identifier": "[A-Za-z_][A-Za-z0-9_]{0,31}",
}
PATTERNS = {**FORMATS, **REAL_WORLD}


def measure_vocabulary(name: str, repeats: int, walks: int) -> list[dict[str, Any]]:
    import xgrammar as xgr

    from triemask.sets.regex import clear_pattern_cache

    loaded = vocabs.load(name)
    vocab = loaded.vocab
    started = time.perf_counter()
    compiler = Compiler(vocab)
    index_seconds = time.perf_counter() - started
    eos = list(vocab.eos_token_ids)
    encoded = _encoded_vocabulary(vocab)
    info = xgr.TokenizerInfo(encoded, xgr.VocabType.RAW, vocab_size=vocab.vocab_size, stop_token_ids=eos)
    llg = LLGuidanceEngine(vocab)
    bitmask = allocate_token_bitmask(1, vocab.vocab_size)
    xgr_bitmask = xgr.allocate_token_bitmask(1, vocab.vocab_size)
    tools = synthetic_tools(1_000, seed=0)
    set_automaton = compiler.compile(tools)
    set_paths = _walks(set_automaton, walks, seed=1)
    set_step = _triemask_step(set_automaton, set_paths, bitmask, repeats)
    compiler.compile_regex("a", layout="lazy")  # (the vocabulary's token trie, for the lazy layout: prepared once)
    rows = []
    for fmt, pattern in PATTERNS.items():

        def cold(pattern: str = pattern) -> None:
            clear_pattern_cache()
            compiler.compile_regex(pattern)

        def lazy_cold(pattern: str = pattern) -> None:
            clear_pattern_cache()
            lazy = compiler.compile_regex(pattern, layout="lazy")
            lazy.fill_bitmask(bitmask, (lazy.initial_state,))

        def xgrammar_compile(pattern: str = pattern) -> None:
            compiled = xgr.GrammarCompiler(info, cache_enabled=False).compile_regex(pattern)
            xgr.GrammarMatcher(compiled).fill_next_token_bitmask(xgr_bitmask)

        def llguidance_compile(pattern: str = pattern) -> None:
            request = llg.request(llg.ll.LLMatcher.grammar_from_regex(pattern))
            request.fill(bitmask, 0)

        cold_s = median_seconds(cold, repeats)
        warm_s = median_seconds(lambda pattern=pattern: compiler.compile_regex(pattern), repeats)
        lazy_s = median_seconds(lazy_cold, repeats)
        xgr_s = median_seconds(xgrammar_compile, repeats)
        llg_s = median_seconds(llguidance_compile, repeats)
        automaton = compiler.compile_regex(pattern)
        compiled = xgr.GrammarCompiler(info, cache_enabled=False).compile_regex(pattern)
        paths = _walks(automaton, walks, seed=2)
        step = _triemask_step(automaton, paths, bitmask, repeats)
        xgr_step = _xgrammar_step(xgr, compiled, paths, xgr_bitmask, repeats)
        checked = _walks(automaton, 4 * walks, seed=3)
        compared, differing = _differences(xgr, automaton, compiled, checked)
        lazy = compiler.compile_regex(pattern, layout="lazy")
        lazy_compared, lazy_differing = _differences(xgr, lazy, compiled, checked)
        rows.append(
            {
                "vocabulary": name,
                "family": loaded.family,
                "vocab_size": vocab.vocab_size,
                "format": fmt,
                "kind": "format" if fmt in FORMATS else "real-world",
                "dag_nodes": automaton.num_nodes,
                "edges": automaton.stats()["edges"],
                "memory_bytes": automaton.memory_bytes,
                "triemask_cold_s": cold_s,
                "triemask_warm_s": warm_s,
                "triemask_lazy_s": lazy_s,
                "lazy_step_s": _triemask_step(lazy, paths, bitmask, repeats),
                "lazy_states_differing": lazy_differing,
                "xgrammar_s": xgr_s,
                "llguidance_s": llg_s,
                "triemask_step_s": step,
                "set_1000_step_s": set_step,
                "xgrammar_step_s": xgr_step,
                "states_compared": compared,
                "states_differing": differing,
                "index_s": index_seconds,
            }
        )
        log(
            f"{name} {fmt}: triemask {cold_s * 1e3:.2f} (warm {warm_s * 1e3:.2f}, lazy {lazy_s * 1e3:.2f}) ms, "
            f"xgrammar {xgr_s * 1e3:.2f} ms, "
            f"llguidance {llg_s * 1e3:.2f} ms; step {step * 1e6:.1f} vs {xgr_step * 1e6:.1f} us; "
            f"{differing}/{compared} differ (lazy {lazy_differing})"
        )
        assert lazy_compared == compared
    return rows


def measure_layouts(quick: bool) -> list[dict[str, Any]]:
    from triemask.datasets import load_icd10cm

    compiler = Compiler(vocabs.load("qwen2.5").vocab)
    bitmask = allocate_token_bitmask(128, compiler.vocab.vocab_size)
    sets = [("ICD-10-CM", load_icd10cm()), ("tools 10,000", synthetic_tools(10_000))]
    if not quick:
        sets += [(f"tools {k:,}", synthetic_tools(k)) for k in (1_000, 100_000, 1_000_000)]
    rows = []
    for name, values in sets:
        for layout in ("trie", "dag"):
            repeats = 3 if len(values) >= 100_000 else 7
            compile_s = median_seconds(
                lambda values=values, layout=layout: compiler.compile(values, layout=layout), repeats
            )
            automaton = compiler.compile(values, layout=layout)
            paths = _walks(automaton, 16, seed=1)
            rng = random.Random(0)
            states = []
            for path in (paths * 8)[:128]:  # rows part-way through their values
                state = automaton.initial_state
                for token in path[: rng.randrange(len(path))]:
                    state = automaton.next_state(state, token)
                states.append(state)
            rows.append(
                {
                    "set": name,
                    "values": len(values),
                    "layout": layout,
                    "nodes": automaton.num_nodes,
                    "edges": automaton.stats()["edges"],
                    "memory_bytes": automaton.memory_bytes,
                    "compile_s": compile_s,
                    "step_s": _triemask_step(automaton, paths, bitmask[:1], 7),
                    "batch_128_s": median_seconds(lambda a=automaton, s=states: a.fill_bitmask(bitmask, s), 21),
                }
            )
            log(f"{name} {layout}: {compile_s * 1e3:.0f} ms, {automaton.memory_bytes / 1e6:.2f} MB")
    return rows


def peer_ratios(results: dict[str, Any], vocabulary: str = "qwen2.5") -> dict[str, float]:
    """The faster peer's time to a first mask over triemask's, per pattern on ``vocabulary``
    (the one ``--quick`` runs): eager (the first compile) and lazy (to its first mask)."""
    found = {}
    for r in results["rows"]:
        if r["vocabulary"] == vocabulary:
            best = min(r["xgrammar_s"], r["llguidance_s"])
            found[f"{r['format']} ({vocabulary}): eager"] = best / r["triemask_cold_s"]
            found[f"{r['format']} ({vocabulary}): lazy"] = best / r["triemask_lazy_s"]
    return found


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "# Fixed formats (paper Table 17) and real-world finite patterns, measured here",
        "",
        f"{results['date']}, {results['machine']}. Compile: median of {results['repeats']} fresh compiles "
        "(xgrammar: cache off, to the first mask; llguidance: to the first mask). triemask *cold* builds the "
        "pattern's automaton too (first compile of that pattern in a process) and every state's edges (the "
        "eager layout); *warm* reuses the pattern's automaton; *lazy* is the cold compile in "
        '`layout="lazy"` (each state\'s edges found on first use) to the first mask, as the peers are '
        "measured. Ratios are peer / triemask. Per step: fill one row + advance, random walks (lazy: its cache "
        "warm after the first walk). Diff: states whose mask differs from xgrammar's regex mask (eager / lazy). "
        "*best / tm*: the faster peer over triemask cold, eager and lazy (issue 29 asks for 2x). llguidance is "
        "lazy too (its figure is one mask); xgrammar builds every state's, as the eager layout does.",
        "",
        "| vocabulary | pattern | edges | triemask cold ms | warm ms | lazy ms | xgrammar ms | llguidance ms "
        "| xgr / tm | llg / tm | best / tm eager | best / tm lazy | step us | lazy step us | set-1000 step us "
        "| xgr step us | diff |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines.extend(
        f"| {r['vocabulary']} | {r['format']} | {r['edges']:,} | {r['triemask_cold_s'] * 1e3:.2f} "
        f"| {r['triemask_warm_s'] * 1e3:.2f} | {r['triemask_lazy_s'] * 1e3:.2f} | {r['xgrammar_s'] * 1e3:.2f} "
        f"| {r['llguidance_s'] * 1e3:.2f} "
        f"| {r['xgrammar_s'] / r['triemask_cold_s']:.1f}x | {r['llguidance_s'] / r['triemask_cold_s']:.1f}x "
        f"| {min(r['xgrammar_s'], r['llguidance_s']) / r['triemask_cold_s']:.2f}x "
        f"| {min(r['xgrammar_s'], r['llguidance_s']) / r['triemask_lazy_s']:.2f}x "
        f"| {r['triemask_step_s'] * 1e6:.1f} | {r['lazy_step_s'] * 1e6:.1f} | {r['set_1000_step_s'] * 1e6:.1f} "
        f"| {r['xgrammar_step_s'] * 1e6:.1f} "
        f"| {r['states_differing']} / {r['lazy_states_differing']} of {r['states_compared']} |"
        for r in results["rows"]
    )
    lines += [
        "",
        "## Set layouts (Qwen2.5): trie vs minimal DAG",
        "",
        "| set | values | layout | nodes | edges | memory MB | compile ms | step us | batch 128 us |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    lines.extend(
        f"| {r['set']} | {r['values']:,} | {r['layout']} | {r['nodes']:,} | {r['edges']:,} "
        f"| {r['memory_bytes'] / 1e6:.2f} | {r['compile_s'] * 1e3:.0f} | {r['step_s'] * 1e6:.1f} "
        f"| {r['batch_128_s'] * 1e6:.0f} |"
        for r in results["layouts"]
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks formats", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="qwen2.5 only, 7 repeats")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--vocabularies", nargs="+", choices=list(vocabs.VOCABULARIES))
    parser.add_argument("--repeats", type=int, default=9)
    options = parser.parse_args(argv)
    names = options.vocabularies or (["qwen2.5"] if options.quick else list(vocabs.VOCABULARIES))
    # (7, not 3: a compile of 0.05 ms measured three times took one hiccup for its median, and
    # make bench-check, which reads this run, failed a pattern at 2.9x against its 7.4x)
    repeats = 7 if options.quick else options.repeats
    rows = []
    for name in names:
        rows.extend(measure_vocabulary(name, repeats, walks=8 if options.quick else 16))
    from . import __main__ as suite

    results = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": suite.machine()["cpu"],
        "repeats": repeats,
        "rows": rows,
        "layouts": measure_layouts(options.quick),
    }
    stem = "formats-quick" if options.quick else "formats"
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    (options.out / f"{stem}.md").write_text(markdown(results))
    print(markdown(results))
