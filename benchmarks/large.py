"""Large sets: a million values and beyond, real and synthetic, triemask alone.

    python -m benchmarks large [--quick] [--out benchmarks/results]

Each set compiles in a fresh process (Qwen2.5, the token index prepared first): compile
time, the automaton's size (``memory_bytes``), peak RSS during the compile (over the
process's RSS before it, and per byte of input), then a step (through ``Matcher`` and
through ``fill_bitmask`` + ``next_state``) and a 128-row batch fill on 32 sampled values.

Sets: synthetic tools at 1, 2 and 5 million (``triemask.datasets.synthetic_tools``);
500,000 identifiers like ``service_000123456.method_123456`` (little shared structure);
the 663,473 words of Debian's ``wamerican-insane``; the 4,499,322 npm package names of
``all-the-package-names`` (the last two fetched once and cached: benchmarks/large_sets.py).
``--quick``: tools 1M and the words only.

Lazy layout (``compile(values, layout="lazy")``): tools 100K and 1M, the words and the npm
names compile in both layouts, each in a fresh process: size (the trie arrays and the cache
after the warm runs, and the cache bound), the cold step (the cache emptied before each of
the 32 values, so every node's edges are found on the way), the first step at the root
alone, the warm step and the batch fill, against the eager layout's.
``--quick``: tools 100K and 1M.

The peers at 100,000 values are in the main suite's compile sweep
(``benchmarks/results/full.md``): this file quotes how each fared there.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from .measure import compile_sweep

CASES = [
    ("tools 1M", "tools", 1_000_000),
    ("tools 2M", "tools", 2_000_000),
    ("tools 5M", "tools", 5_000_000),
    ("ids 500K", "ids", 500_000),
    ("words (Debian wamerican-insane)", "words", 0),
    ("npm package names", "npm-names", 0),
]
QUICK = ("tools 1M", "words (Debian wamerican-insane)")
LAZY_CASES = [
    ("tools 100K", "tools", 100_000),
    ("tools 1M", "tools", 1_000_000),
    ("words (Debian wamerican-insane)", "words", 0),
    ("npm package names", "npm-names", 0),
]
LAZY_QUICK = ("tools 100K", "tools 1M")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def peers_at_100k(full: Path) -> list[list[str]]:
    """How each engine fared at K = 100,000 in the committed full run."""
    if not full.exists():
        return []
    sweeps = json.loads(full.read_text()).get("compile", {})
    rows = []
    for engine, sweep in sweeps.items():
        entry = sweep.get("sizes", {}).get("100000", {})
        status = entry.get("status", "-")
        if status == "ok":
            text = f"compiles in {entry['first_s']:.2f} s"
        elif status == "timeout":
            text = f"no first mask within {entry.get('timeout_s', 0):.0f} s (timeout)"
        else:
            text = f"fails: {entry.get('error', status)}"
        rows.append([engine, text])
    return rows


def _mb(value: float) -> str:
    return f"{value / 1e6:,.0f} MB"


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# Large sets (triemask alone, {results['date']})\n",
        f"Machine: {results['machine']}. Vocabulary: Qwen2.5. Each set in a fresh process.\n",
    ]
    if results["sets"]:
        lines += [
            "| set | values | input | trie nodes | edges | compile | automaton | peak RSS (x input, x automaton) "
            "| step (Matcher / stateless) | batch fill B = 128 |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
    for label, entry in results["sets"].items():
        if entry.get("status") != "ok":
            lines.append(f"| {label} | {entry.get('error', entry.get('status'))} |||||||||")
            continue
        peak = entry["peak_rss_delta_bytes"]
        lines.append(
            f"| {label} | {entry['values']:,} | {_mb(entry['input_bytes'])} | {entry['nodes']:,} | {entry['edges']:,} "
            f"| {entry['first_s']:.2f} s | {_mb(entry['memory_bytes'])} "
            f"| +{_mb(peak)} ({peak / entry['input_bytes']:.1f}x, {peak / entry['memory_bytes']:.1f}x) "
            f"| {entry['per_step_s'] * 1e6:.2f} / {entry['per_step_stateless_s'] * 1e6:.2f} us "
            f"| {entry['batch_fill_128_s'] * 1e6:.0f} us |"
        )
    if results.get("lazy"):
        lines += [
            "",
            "## Lazy layout against the eager one",
            "",
            "Size: the trie arrays plus the cache in use after the warm runs (bound 8 MiB). Cold: the cache "
            "emptied before each of 32 values (every node's edges found on the way); root: the first mask "
            "of an empty cache. Warm: the same steps with the nodes cached (Matcher), measured in the lazy "
            "process against an eager automaton of the same set, alternating, medians of 15 rounds.",
            "",
            "| set | compile eager / lazy | size eager / lazy (ratio) | step eager | step lazy warm (ratio) "
            "| step lazy cold | root cold | batch fill 128 eager / lazy |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for label, pair in results["lazy"].items():
            eager, lazy = pair.get("trie", {}), pair.get("lazy", {})
            if eager.get("status") != "ok" or lazy.get("status") != "ok":
                failed = eager if eager.get("status") != "ok" else lazy
                lines.append(f"| {label} | {failed.get('error', failed.get('status'))} |||||||")
                continue
            size, step = lazy["memory_bytes_after"], lazy["paired_step_s"]
            lines.append(
                f"| {label} | {eager['first_s']:.2f} / {lazy['first_s']:.2f} s "
                f"| {_mb(eager['memory_bytes'])} / {size / 1e6:,.1f} MB ({eager['memory_bytes'] / size:.1f}x) "
                f"| {step['trie'] * 1e6:.2f} us "
                f"| {step['lazy'] * 1e6:.2f} us ({step['lazy'] / step['trie']:.2f}x) "
                f"| {lazy['per_step_cold_s'] * 1e6:.1f} us | {lazy['root_cold_s'] * 1e3:.2f} ms "
                f"| {eager['batch_fill_128_s'] * 1e6:.0f} / {lazy['batch_fill_128_s'] * 1e6:.0f} us |"
            )
    if results["peers_100k"]:
        lines += ["", "The peers at K = 100,000 synthetic tools (the main suite's full run):", ""]
        lines += ["| engine | K = 100,000 |", "|---|---|"]
        lines += [f"| {engine} | {text} |" for engine, text in results["peers_100k"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks large", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tools 1M and the words only")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per compile")
    parser.add_argument("--lazy-only", action="store_true", help="only the lazy-layout comparison")
    options = parser.parse_args(argv)
    from . import __main__ as suite

    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": suite.machine()["cpu"],
        "sets": {},
        "peers_100k": peers_at_100k(options.out / "full.json"),
        "lazy": {},
    }
    for label, name, k in [] if options.lazy_only else CASES:
        if options.quick and label not in QUICK:
            continue
        log(f"large: {label}")
        sweep = compile_sweep("triemask", "qwen2.5", name, [k], options.timeout, repeat_budget=0, decode=True)
        results["sets"][label] = {**sweep["sizes"][str(k)], "prepare_s": sweep.get("prepare_s")}
        log(f"large: {label}: {results['sets'][label]}")
    for label, name, k in LAZY_CASES:
        if options.quick and label not in LAZY_QUICK:
            continue
        for layout in ("trie", "lazy"):
            log(f"large: {label}, layout {layout}")
            sweep = compile_sweep(
                "triemask", "qwen2.5", name, [k], options.timeout, repeat_budget=0, decode=True, layout=layout
            )
            results["lazy"].setdefault(label, {})[layout] = sweep["sizes"][str(k)]
            log(f"large: {label}, layout {layout}: {sweep['sizes'][str(k)]}")
    stem = "large-quick" if options.quick else "large-lazy" if options.lazy_only else "large"
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    (options.out / f"{stem}.md").write_text(markdown(results))
    print(markdown(results))
