"""Mixed schemas: triemask's compile_json_schema / compile_tools against xgrammar's
compile_json_schema of the same schema and llguidance's JSON, side by side.

    python -m benchmarks schemas [--quick] [--out benchmarks/results]

Qwen2.5 vocabulary (151,936), compact JSON (``any_whitespace=False``). Measured:

* compile time (triemask: a fresh compile; the per-vocabulary preparation it shares
  between schemas is reported once, apart);
* per step, fill one bitmask row + accept the token, along the natural tokenization
  of a JSON instance, split into steps inside an enum value and outside (median
  over steps of the median over repeats), with the bare set's per step for the same
  values as the yardstick inside;
* batch fill at B = 128 (matchers at the states of 128 instances' walks);
* mask differences from xgrammar's whole-schema language along random walks, every
  differing token judged by xgrammar's ``accept_token`` (tests/test_schemas.py).

xgrammar compiles of large schemas run in a child process under a timeout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from triemask import Compiler, Matcher, Vocabulary, fill_next_token_bitmasks
from triemask.datasets import load_icd10cm, load_tool_registry, synthetic_products, synthetic_tools, tool_specs
from triemask.schemas import clear_structure_cache

from . import vocabs

VOCAB = "qwen2.5"
OPTIONS = {"any_whitespace": False}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- schemas and instances ------------------------------------------------------------------------


def tool_call_schema(names: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "name": {"enum": names},
            "arguments": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query"],
            },
        },
        "required": ["name", "arguments"],
    }


def classification_schema(labels: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"label": {"enum": labels}, "confidence": {"type": "number"}, "why": {"type": "string"}},
        "required": ["label", "confidence"],
    }


def entity_schema(ids: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "mention": {"type": "string"},
            "entity": {"enum": ids},
            "kind": {"enum": ["disease", "symptom", "procedure"]},
        },
        "required": ["mention", "entity", "kind"],
    }


def instances(kind: str, values: list[str], n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    picked = [rng.choice(values) for _ in range(n)]
    if kind == "tool":
        return [{"name": v, "arguments": {"query": "weather in Paris today", "limit": 3}} for v in picked]
    if kind == "classification":
        return [{"label": v, "confidence": 0.87, "why": "the product matches the description"} for v in picked]
    return [{"mention": "type 2 diabetes", "entity": v, "kind": "disease"} for v in picked]


def tools_any_of(specs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": s["function"]["name"]}, "arguments": s["function"]["parameters"]},
                "required": ["name", "arguments"],
            }
            for s in specs
        ]
    }


def tool_instances(specs: list[dict[str, Any]], n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    made = []
    for spec in rng.sample(specs, min(n, len(specs))):
        arguments: dict[str, Any] = {}
        for key, field in spec["function"]["parameters"]["properties"].items():
            if "enum" in field:
                arguments[key] = rng.choice(field["enum"])
            elif field.get("type") == "integer":
                arguments[key] = 10
            elif field.get("type") == "string":
                arguments[key] = "ab12"
        made.append({"name": spec["function"]["name"], "arguments": arguments})
    return made


# --- engines ---------------------------------------------------------------------------------


class Peers:
    """xgrammar and llguidance on the benchmark's vocabulary."""

    def __init__(self, vocab: Vocabulary) -> None:
        import llguidance
        import llguidance.numpy
        import xgrammar

        from .peers import ByteTokenizer

        self.xgr = xgrammar
        self.ll = llguidance
        self.ll_numpy = llguidance.numpy
        # special tokens as empty strings: xgrammar never allows them (a placeholder text
        # would be allowed inside JSON strings, and the masks would differ for that alone)
        encoded = [vocab.token_bytes(i) or b"" for i in range(len(vocab))]
        info = xgrammar.TokenizerInfo(
            encoded, xgrammar.VocabType.RAW, vocab_size=vocab.vocab_size, stop_token_ids=list(vocab.eos_token_ids)
        )
        self.xgr_compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
        self.xgr_cached = xgrammar.GrammarCompiler(info)  # (its defaults: its caches on, unbounded)
        self.ll_tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(ByteTokenizer(vocab)))
        self.executor = llguidance.LLExecutor()

    def xgrammar(self, schema: dict[str, Any]) -> Any:
        return self.xgr_compiler.compile_json_schema(json.dumps(schema), **OPTIONS)

    def llguidance(self, schema: dict[str, Any]) -> Any:
        grammar = self.ll.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), defaults={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
        )
        matcher = self.ll.LLMatcher(self.ll_tokenizer, grammar)
        if matcher.is_error():
            raise RuntimeError(matcher.get_error())
        return grammar


def median_time(fn: Callable[[], object], repeats: int, budget: float = 20.0) -> float:
    times: list[float] = []
    started = time.perf_counter()
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - started > budget:
            break
    return statistics.median(times)


def paired(
    ours: Callable[[], float], theirs: Callable[[], float], minimum: int, budget: float, most: int
) -> list[tuple[float, float]]:
    """(ours, theirs) times, in pairs so that a slower spell of the machine hits both, each
    pair's order the reverse of the one before (the second runs on caches the first evicted):
    at least ``minimum`` pairs, more within ``budget`` seconds, at most ``most``."""
    pairs: list[tuple[float, float]] = []
    started = time.perf_counter()
    while len(pairs) < minimum or (len(pairs) < most and time.perf_counter() - started < budget):
        if len(pairs) % 2 == 0:
            ours_first = ours()
            pairs.append((ours_first, theirs()))
        else:
            theirs_first = theirs()
            pairs.append((ours(), theirs_first))
    return pairs


def xgrammar_in_child(schema: dict[str, Any], timeout: float, out: Path) -> float | str:
    """xgrammar's compile of ``schema`` in a fresh process, or "timeout"."""
    path = out / ".schema-for-xgrammar.json"
    path.write_text(json.dumps(schema))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.schemas", "--xgrammar-compile", str(path)],
            capture_output=True,
            text=True,
            timeout=timeout + 60,  # start-up: imports and the vocabulary
        )
    except subprocess.TimeoutExpired:
        return "timeout"
    finally:
        path.unlink(missing_ok=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        return f"error: {(done.stderr.strip().splitlines() or ['?'])[-1][:120]}"
    seconds = float(lines[-1])
    return seconds if seconds <= timeout else "timeout"


# --- measurements ----------------------------------------------------------------------------


def walk_tokens(loaded: vocabs.LoadedVocabulary, made: list[dict[str, Any]]) -> list[list[int]]:
    assert loaded.encode is not None
    texts = [json.dumps(m, ensure_ascii=False) for m in made]
    return loaded.encode(texts)


def per_step(
    compiled: Any,
    xgr_compiled: Any,
    ll_grammar: Any,
    peers: Peers,
    vocab: Vocabulary,
    walks: list[list[int]],
    repeats: int,
) -> dict[str, Any]:
    """Per-step fill + accept along ``walks``, inside and outside enum values."""
    width = (vocab.vocab_size + 31) // 32
    row = np.zeros((1, width), dtype=np.int32)
    eos = vocab.eos_token_ids[0]
    samples: dict[str, dict[str, list[float]]] = {"inside": {}, "outside": {}}
    for tokens in walks:
        tokens = [*tokens, eos]
        inside: list[bool] = []
        probe = Matcher(compiled)
        for token in tokens:
            inside.append(probe.in_enum_value)
            assert probe.accept_token(token), (probe.text, token)
        runs: dict[str, list[list[float]]] = {"triemask": [], "xgrammar": [], "llguidance": []}
        for _ in range(repeats):
            matcher = Matcher(compiled)
            times = []
            for token in tokens:
                t0 = time.perf_counter()
                matcher.fill_next_token_bitmask(row)
                matcher.accept_token(token)
                times.append(time.perf_counter() - t0)
            runs["triemask"].append(times)
            if xgr_compiled is not None:
                xm = peers.xgr.GrammarMatcher(xgr_compiled)
                times = []
                for token in tokens:
                    t0 = time.perf_counter()
                    xm.fill_next_token_bitmask(row)
                    xm.accept_token(token)
                    times.append(time.perf_counter() - t0)
                runs["xgrammar"].append(times)
            if ll_grammar is not None:
                lm = peers.ll.LLMatcher(peers.ll_tokenizer, ll_grammar)
                times = []
                for token in tokens:
                    t0 = time.perf_counter()
                    peers.ll_numpy.fill_next_token_bitmask(lm, row, 0)
                    lm.consume_token(token)
                    times.append(time.perf_counter() - t0)
                runs["llguidance"].append(times)
        for engine, measured in runs.items():
            if not measured:
                continue
            for step, flag in enumerate(inside):
                samples["inside" if flag else "outside"].setdefault(engine, []).append(
                    statistics.median(r[step] for r in measured)
                )
    return {
        where: {
            # (the mean too: a step that leaves a union's discriminator compiles or feeds a choice)
            engine: {"median_us": statistics.median(v) * 1e6, "mean_us": statistics.mean(v) * 1e6, "steps": len(v)}
            for engine, v in by_engine.items()
        }
        for where, by_engine in samples.items()
    }


def bare_set_per_step(compiler: Compiler, texts: list[bytes], loaded: vocabs.LoadedVocabulary, repeats: int) -> float:
    """The bare set's fill + next_state for the same values (their JSON text, eos=False)."""
    automaton = compiler.compile(texts, eos=False)
    vocab = loaded.vocab
    row = np.zeros((1, (vocab.vocab_size + 31) // 32), dtype=np.int32)
    assert loaded.encode is not None
    times = []
    for tokens in loaded.encode([t.decode() for t in texts[:20]]):
        for _ in range(repeats):
            state = automaton.initial_state
            for token in tokens:
                t0 = time.perf_counter()
                automaton.fill_bitmask(row, (state,))
                state = automaton.next_state(state, token)
                times.append(time.perf_counter() - t0)
            assert automaton.is_accepting(state)
    return statistics.median(times) * 1e6


def batch_fill(
    compiled: Any,
    xgr_compiled: Any,
    peers: Peers,
    vocab: Vocabulary,
    walks: list[list[int]],
    repeats: int,
    size: int = 128,
) -> dict[str, float]:
    """Fill ``size`` rows in one call, the matchers at states along the walks."""
    rng = random.Random(5)
    width = (vocab.vocab_size + 31) // 32
    bitmask = np.zeros((size, width), dtype=np.int32)
    ours, theirs = [], []
    for i in range(size):
        tokens = walks[i % len(walks)]
        cut = rng.randrange(len(tokens))
        matcher = Matcher(compiled)
        assert matcher.accept_tokens(tokens[:cut]) == cut
        ours.append(matcher)
        if xgr_compiled is not None:
            xm = peers.xgr.GrammarMatcher(xgr_compiled)
            for token in tokens[:cut]:
                xm.accept_token(token)
            theirs.append(xm)
    # single calls, as a server's steps: many, for steady medians, each after a pass over 8 MB
    # (as a server's forward pass between two steps: neither runs on caches its own previous
    # call or the other's left, which moved the ratio by up to 7% from one process to the
    # next); with xgrammar's, in pairs (a slower spell of the machine hits both), each pair's
    # order the other's reverse, at least 31 pairs, more within 1 s; the ratio is the median
    # of the pairs' ratios
    batcher = peers.xgr.BatchGrammarMatcher()
    between_steps = np.zeros(1 << 20, dtype=np.int64)

    def ours_fill() -> float:
        np.add(between_steps, 1, out=between_steps)
        return median_time(lambda: fill_next_token_bitmasks(ours, bitmask), 1)

    def xgrammar_fill() -> float:
        np.add(between_steps, 1, out=between_steps)
        return median_time(lambda: batcher.batch_fill_next_token_bitmask(theirs, bitmask), 1)

    if not theirs:
        return {"triemask_us": statistics.median(ours_fill() for _ in range(max(repeats, 31))) * 1e6}
    pairs = paired(ours_fill, xgrammar_fill, max(repeats, 31), 1.0, 501)
    return {
        "triemask_us": statistics.median(o for o, _ in pairs) * 1e6,
        "xgrammar_us": statistics.median(t for _, t in pairs) * 1e6,
        "pairs": len(pairs),
        "ratio": statistics.median(t / o for o, t in pairs),
    }


def mismatches(
    compiled: Any, xgr_compiled: Any, peers: Peers, vocab: Vocabulary, walks: int, seed: int
) -> dict[str, int]:
    """Tokens where triemask's mask and the whole schema's language (xgrammar's
    accept_token) disagree, along random walks biased to tokens holding quotes."""
    rng = random.Random(seed)
    width = (vocab.vocab_size + 31) // 32
    row = np.zeros((1, width), dtype=np.int32)
    bad = steps = 0
    for _ in range(walks):
        ours, theirs = Matcher(compiled), peers.xgr.GrammarMatcher(xgr_compiled)
        for _ in range(60):
            allowed = set(ours.allowed_token_ids().tolist())
            theirs.fill_next_token_bitmask(row)
            bits = np.unpackbits(row.view(np.uint8), bitorder="little")[: vocab.vocab_size]
            for token in allowed ^ set(np.flatnonzero(bits).tolist()):
                bad += (token in allowed) != theirs.fork().accept_token(token)
            steps += 1
            if not allowed:
                break
            quoted = [t for t in allowed if b'"' in (vocab.token_bytes(t) or b"")]
            token = rng.choice(sorted(quoted if quoted and rng.random() < 0.5 else allowed))
            ours.accept_token(token)
            theirs.accept_token(token)
            if ours.is_terminated():
                break
    return {"steps": steps, "differing_tokens": bad}


# --- scenarios -------------------------------------------------------------------------------


def scenario(
    name: str,
    compile_ours: Callable[[], Any],
    schema: dict[str, Any],
    made: list[dict[str, Any]],
    loaded: vocabs.LoadedVocabulary,
    peers: Peers,
    options: argparse.Namespace,
    enum_texts: list[bytes] | None,
    compiler: Compiler,
) -> dict[str, Any]:
    log(f"{name}: compiling")
    vocab = loaded.vocab
    result: dict[str, Any] = {"name": name}
    compiled = compile_ours()
    # a new structure each time (xgrammar's cache is off too), and one compiled before (a
    # schema of the same skeleton: only the enum values differ)
    result["triemask_compile_s"] = median_time(lambda: (clear_structure_cache(), compile_ours()), options.repeats)
    result["triemask_known_structure_compile_s"] = median_time(compile_ours, options.repeats)
    result["triemask_memory_bytes"] = compiled.memory_bytes
    size = len(json.dumps(schema))
    if size < 400_000:  # in process: medians
        xgr_compiled = peers.xgrammar(schema)
        result["xgrammar_compile_s"] = median_time(lambda: peers.xgrammar(schema), options.repeats, budget=10)
    else:
        xgr_compiled = None
        result["xgrammar_compile_s"] = xgrammar_in_child(schema, options.timeout, options.out)
    try:
        ll_grammar = peers.llguidance(schema)
        result["llguidance_compile_s"] = median_time(lambda: peers.llguidance(schema), options.repeats, budget=10)
    except Exception as exc:  # llguidance refuses large grammars with its default limits
        ll_grammar = None
        result["llguidance_compile_s"] = f"error: {str(exc).splitlines()[0][:120]}"
    for peer in ("xgrammar", "llguidance"):
        seconds = result[f"{peer}_compile_s"]
        if isinstance(seconds, float):
            result[f"compile_ratio_{peer}"] = seconds / result["triemask_compile_s"]
    log(f"{name}: per step")
    walks = walk_tokens(loaded, made)
    result["per_step"] = per_step(compiled, xgr_compiled, ll_grammar, peers, vocab, walks, options.step_repeats)
    if enum_texts is not None:
        result["bare_set_per_step_us"] = bare_set_per_step(compiler, enum_texts, loaded, options.step_repeats)
    result["batch_128"] = batch_fill(compiled, xgr_compiled, peers, vocab, walks, options.repeats)
    if xgr_compiled is not None:
        log(f"{name}: cross-check")
        result["cross_check"] = mismatches(compiled, xgr_compiled, peers, vocab, options.walks, seed=1)
    log(f"{name}: {summary_line(result)}")
    return result


def tool_pause(compiler: Compiler, specs: list[dict[str, Any]], loaded: vocabs.LoadedVocabulary) -> dict[str, float]:
    """The fill at which a chosen tool's argument schema is compiled (empty cache), against
    the same fill once it is cached."""
    compiled = compiler.compile_tools(specs, **OPTIONS)
    made = tool_instances(specs, 1, seed=3)[0]
    (tokens,) = walk_tokens(loaded, [made])
    row = np.zeros((1, (loaded.vocab.vocab_size + 31) // 32), dtype=np.int32)

    def slowest_fill() -> float:
        matcher = Matcher(compiled)
        worst = 0.0
        for token in tokens:
            t0 = time.perf_counter()
            matcher.fill_next_token_bitmask(row)
            worst = max(worst, time.perf_counter() - t0)
            matcher.accept_token(token)
        return worst

    cold = slowest_fill()
    warm = slowest_fill()
    return {"uncached_pause_ms": cold * 1e3, "cached_slowest_fill_ms": warm * 1e3}


def summary_line(r: dict[str, Any]) -> str:
    def fmt(x: Any) -> str:
        return f"{x * 1e3:.1f} ms" if isinstance(x, float) else str(x)

    inside = r["per_step"].get("inside", {})
    outside = r["per_step"].get("outside", {})
    parts = [
        f"compile triemask {fmt(r['triemask_compile_s'])}, xgrammar {fmt(r['xgrammar_compile_s'])}, "
        f"llguidance {fmt(r['llguidance_compile_s'])}"
    ]
    for where, by_engine in (("inside", inside), ("outside", outside)):
        parts.append(f"{where}: " + ", ".join(f"{e} {v['median_us']:.1f} us" for e, v in by_engine.items()))
    return "; ".join(parts)


def run(options: argparse.Namespace) -> dict[str, Any]:
    loaded = vocabs.load(VOCAB)
    compiler = Compiler(loaded.vocab)
    peers = Peers(loaded.vocab)
    started = time.perf_counter()
    compiler.compile_json_schema(tool_call_schema(synthetic_tools(64)), **OPTIONS)  # the shared preparation
    results: dict[str, Any] = {"vocabulary": VOCAB, "options": OPTIONS, "preparation_s": time.perf_counter() - started}
    scenarios: list[dict[str, Any]] = []

    def json_scenario(name: str, schema: dict[str, Any], kind: str, values: list[str]) -> None:
        texts = [json.dumps(v, ensure_ascii=False).encode() for v in values]
        scenarios.append(
            scenario(
                name,
                lambda: compiler.compile_json_schema(schema, **OPTIONS),
                schema,
                instances(kind, values, options.instances, seed=2),
                loaded,
                peers,
                options,
                texts,
                compiler,
            )
        )

    json_scenario("tool calling, K = 1,000", tool_call_schema(synthetic_tools(1_000)), "tool", synthetic_tools(1_000))
    json_scenario(
        "classification, K = 500",
        classification_schema(synthetic_products(500)),
        "classification",
        synthetic_products(500),
    )
    codes = load_icd10cm()[:5_000]
    json_scenario("entity linking, K = 5,000", entity_schema(codes), "entity", codes)
    for k in [10_000] if options.quick else [10_000, 100_000]:
        names = synthetic_tools(k, seed=1)
        json_scenario(f"enum in JSON, K = {k:,}", tool_call_schema(names), "tool", names)
    registry = load_tool_registry()
    for n in [100, 1_000] if options.quick else [100, 1_000, 10_000]:
        specs = tool_specs(registry[:n])
        schema = tools_any_of(specs)
        scenarios.append(
            scenario(
                f"tools with arguments, {n:,} tools",
                lambda specs=specs: compiler.compile_tools(specs, **OPTIONS),
                schema,
                tool_instances(specs, options.instances, seed=2),
                loaded,
                peers,
                options,
                None,
                compiler,
            )
        )
        scenarios[-1]["tool_pause"] = tool_pause(compiler, specs, loaded)
    results["scenarios"] = scenarios
    return results


# --- the peer table: ordinary schemas, where xgrammar alone is the yardstick ----------------------

# One function's arguments, written as real APIs write them: small enums (no trie field), a
# nested object, an array, numbers and a boolean.
FUNCTION_ARGUMENTS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "location": {"type": "string", "description": "City and country, e.g. Paris, France"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit", "kelvin"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "include": {"type": "array", "items": {"type": "string", "enum": ["hourly", "daily", "alerts", "air"]}},
        "detail": {"type": "string", "enum": ["summary", "full"]},
        "coordinates": {
            "type": "object",
            "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
            "required": ["lat", "lon"],
        },
        "metric": {"type": "boolean"},
    },
    "required": ["location", "unit", "days"],
}


def function_arguments_instances(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {
            "location": rng.choice(["Paris, France", "Lima, Peru", "Oslo, Norway"]),
            "unit": rng.choice(["celsius", "fahrenheit", "kelvin"]),
            "days": rng.randrange(1, 15),
            "include": rng.sample(["hourly", "daily", "alerts", "air"], 2),
            "detail": "full",
            "coordinates": {"lat": 48.85, "lon": 2.35},
            "metric": True,
        }
        for _ in range(n)
    ]


def labels_schema(labels: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"label": {"enum": labels}, "reason": {"type": "string"}, "score": {"type": "integer"}},
        "required": ["label", "reason", "score"],
    }


def labels_instances(labels: list[str], n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"label": rng.choice(labels), "reason": "it says so in the text", "score": 7} for _ in range(n)]


def vllm_required_schema(specs: list[dict[str, Any]]) -> dict[str, Any]:
    """What vLLM 0.32 builds for ``tool_choice="required"`` (``vllm/tool_parsers/utils.py``,
    ``_get_json_schema_from_tools``): an array of one or more calls, each an ``anyOf`` of one
    branch per tool whose name is a one-value enum."""
    return {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "anyOf": [
                {
                    "properties": {
                        "name": {"type": "string", "enum": [s["function"]["name"]]},
                        "parameters": s["function"]["parameters"],
                    },
                    "required": ["name", "parameters"],
                }
                for s in specs
            ],
        },
    }


def vllm_required_instances(specs: list[dict[str, Any]], n: int, seed: int) -> list[Any]:
    return [[{"name": c["name"], "parameters": c["arguments"]}] for c in tool_instances(specs, n, seed)]


def structural_variant(schema: dict[str, Any], i: int) -> dict[str, Any]:
    """``schema`` with its grammar changed at the root (a root array's bound, a root object's
    optional property): a new structure, whose other rules are those compiled before."""
    if schema.get("type") == "array":
        return {**schema, "maxItems": 100 + i}
    return {**schema, "properties": {**schema["properties"], f"variant_{i}": {"type": "integer"}}}


def description_variant(schema: dict[str, Any], i: int) -> dict[str, Any]:
    """``schema`` with another root description: the same structure, another text."""
    return {**schema, "description": f"variant {i}"}


def peer_row(
    name: str,
    schema: dict[str, Any],
    made: list[Any],
    loaded: vocabs.LoadedVocabulary,
    peers: Peers,
    options: Any,
    enum_values: list[str] | None = None,
    xgrammar_batch: bool = True,
) -> dict[str, Any]:
    """One row of the peer table: compile (a new structure; a known one), per step and the
    batch of 64, triemask's ``compile_json_schema`` against xgrammar's on the same schema;
    with ``enum_values``, the bare set's step for them too (the yardstick inside the enum).
    ``xgrammar_batch=False``: triemask's batch alone (xgrammar's 64 matchers would not fit)."""
    compiler = Compiler(loaded.vocab)
    log(f"{name}: compiling")
    compiled = compiler.compile_json_schema(schema, **OPTIONS)
    row: dict[str, Any] = {"name": name, "trie_fields": len(compiled.stats()["trie_fields"])}
    row["triemask_known_structure_compile_s"] = median_time(
        lambda: compiler.compile_json_schema(schema, **OPTIONS), options.repeats
    )
    xgr_compiled = peers.xgrammar(schema)

    # the two first compiles, each engine's caches emptied before it (as in a new process;
    # xgrammar through its default compiler, caches on, as vLLM and SGLang run it: its first
    # compile fills them, as ours does), in pairs (a compile of 15-40 ms moves by up to 10% from
    # one to the next on 2 cores); at least 15 pairs, more within 4 s
    def ours_compile() -> float:
        clear_structure_cache()
        return median_time(lambda: compiler.compile_json_schema(schema, **OPTIONS), 1)

    def xgrammar_compile() -> float:
        peers.xgr_cached.clear_cache()
        return median_time(lambda: peers.xgr_cached.compile_json_schema(json.dumps(schema), **OPTIONS), 1)

    pairs = paired(ours_compile, xgrammar_compile, max(options.repeats, 15), 4.0, 101)
    row["triemask_compile_s"] = statistics.median(ours for ours, _ in pairs)
    row["xgrammar_compile_s"] = statistics.median(theirs for _, theirs in pairs)
    row["compile_pairs"] = len(pairs)
    row["compile_ratio"] = statistics.median(theirs / ours for ours, theirs in pairs)

    # a new schema in a process that compiled others before, each engine with its caches
    # (xgrammar's default GrammarCompiler keeps its rules' masks, as vLLM runs it): each pair
    # compiles a variant neither compiled before, of a new structure (structural_variant) and
    # of a new root description (which no grammar reads: triemask's skeleton cache takes it)
    def new_schemas_warm(variant: Callable[[dict[str, Any], int], dict[str, Any]]) -> list[tuple[float, float]]:
        ours_made, theirs_made = itertools.count(), itertools.count()

        def ours() -> float:
            changed = variant(schema, next(ours_made))
            return median_time(lambda: compiler.compile_json_schema(changed, **OPTIONS), 1)

        def theirs() -> float:  # (its text made inside the time, as peers.xgrammar's)
            changed = variant(schema, next(theirs_made))
            return median_time(lambda: peers.xgr_cached.compile_json_schema(json.dumps(changed), **OPTIONS), 1)

        return paired(ours, theirs, 15 if row["xgrammar_compile_s"] < 0.2 else 5, 4.0, 101)

    if row["xgrammar_compile_s"] < 1.0:  # (xgrammar's first compile under 1 s; 5 pairs above 0.2 s)
        for kind, variant in (("structure", structural_variant), ("description", description_variant)):
            warm = new_schemas_warm(variant)
            row[f"triemask_new_{kind}_warm_s"] = statistics.median(ours for ours, _ in warm)
            row[f"xgrammar_new_{kind}_warm_s"] = statistics.median(theirs for _, theirs in warm)
            row[f"new_{kind}_warm_ratio"] = statistics.median(theirs / ours for ours, theirs in warm)
        peers.xgr_cached.clear_cache()  # (its caches have no bound: emptied after each row)
    walks = walk_tokens(loaded, [json.loads(json.dumps(m)) for m in made])
    log(f"{name}: per step")
    row["per_step"] = per_step(compiled, xgr_compiled, None, peers, loaded.vocab, walks, options.step_repeats)
    batch_against = xgr_compiled if xgrammar_batch else None
    row["batch_64"] = batch_fill(compiled, batch_against, peers, loaded.vocab, walks, options.repeats, size=64)
    if enum_values is not None:
        texts = [json.dumps(v, ensure_ascii=False).encode() for v in enum_values]
        row["bare_set_per_step_us"] = bare_set_per_step(compiler, texts, loaded, options.step_repeats)
        # The bare set's walks run alone (warm caches); the walks above alternate with xgrammar's,
        # which evicts triemask's tables between steps. Like against like: the inside steps alone.
        alone = per_step(compiled, None, None, peers, loaded.vocab, walks, options.step_repeats)
        row["inside_alone_us"] = alone["inside"]["triemask"]["median_us"]
    log(f"{name}: {summary_line({**row, 'llguidance_compile_s': '-'})}")
    return row


def peer_table(options: argparse.Namespace) -> dict[str, Any]:
    """The rows of issue 26's table: ordinary schemas, per step and batch against xgrammar."""
    loaded = vocabs.load(VOCAB)
    peers = Peers(loaded.vocab)
    Compiler(loaded.vocab).compile_json_schema(labels_schema(synthetic_products(300)), **OPTIONS)  # preparation
    specs = tool_specs(load_tool_registry())
    rows = []
    for n in (50, 500, 1_853):  # (below and above DEFAULT_MIN_UNION_BRANCHES; the largest registry)
        chosen = specs[:n]
        rows.append(
            peer_row(
                f"vLLM tool_choice=required, {n:,} tools",
                vllm_required_schema(chosen),
                vllm_required_instances(chosen, options.instances, seed=2),
                loaded,
                peers,
                options,
                # xgrammar's matchers for 1,853 tools hold about 300 MB each after ten tokens (its
                # Earley states for every branch): 64 of them exceed this machine's 24 GiB
                xgrammar_batch=n < 1_000,
            )
        )
    rows.append(
        peer_row(
            "one function's arguments (small enums)",
            FUNCTION_ARGUMENTS,
            function_arguments_instances(options.instances, seed=2),
            loaded,
            peers,
            options,
        )
    )
    for k in (300, 3_000):
        labels = synthetic_products(k)
        rows.append(
            peer_row(
                f"label of {k:,} + reason + score",
                labels_schema(labels),
                labels_instances(labels, options.instances, seed=2),
                loaded,
                peers,
                options,
                labels,
            )
        )
    return {"vocabulary": VOCAB, "options": OPTIONS, "rows": rows}


def peer_ratios(results: dict[str, Any]) -> dict[str, float]:
    """xgrammar's time / triemask's per row and measure (above 1: triemask faster): compile of
    a new structure, per step (the worse of inside and outside an enum), the batch of 64.
    ``python -m benchmarks.check`` guards them."""
    found: dict[str, float] = {}
    for r in results["rows"]:
        steps = [by for by in r["per_step"].values() if by]
        found[f"{r['name']}: compile"] = r.get("compile_ratio", r["xgrammar_compile_s"] / r["triemask_compile_s"])
        for kind in ("structure", "description"):
            if f"new_{kind}_warm_ratio" in r:
                found[f"{r['name']}: new {kind}, warm"] = r[f"new_{kind}_warm_ratio"]
        found[f"{r['name']}: per step"] = min(by["xgrammar"]["median_us"] / by["triemask"]["median_us"] for by in steps)
        if "xgrammar_us" in r["batch_64"]:
            batch = r["batch_64"]
            found[f"{r['name']}: batch 64"] = batch.get("ratio", batch["xgrammar_us"] / batch["triemask_us"])
        if r.get("inside_alone_us"):  # (the bare set's step / the step inside the enum: at least 0.5)
            found[f"{r['name']}: bare set / inside"] = r["bare_set_per_step_us"] / r["inside_alone_us"]
    return found


def peer_markdown(results: dict[str, Any]) -> str:
    lines = [
        "# Ordinary schemas: triemask's compile_json_schema against xgrammar's, same process",
        "",
        f"Vocabulary {results['vocabulary']}, compact JSON. Compile: a new structure, each engine's "
        "caches emptied before each compile (as in a new process; xgrammar through its default "
        "compiler, caches on, as vLLM and SGLang run it), in brackets a schema whose structure was "
        "compiled before; the ratio is the median of the ratios of 15 or more pairs of compiles, "
        "each pair in the order opposite to the one before. New structure, warm: in a process that "
        "compiled others, a variant of the schema neither compiled before, its grammar changed at "
        "the root (a root array's maxItems, a root object's optional property), each engine with its "
        "caches, in pairs likewise; new description, warm: likewise, a variant with another root "
        "description (the same structure, another text). Batch of 64: 31 or more pairs "
        "of calls likewise, each after a pass over 8 MB as a forward pass between two steps. Per step: "
        "fill one row + accept, median over the walks' steps (in brackets "
        "the mean: the step that leaves a union's discriminator compiles the chosen branch the first "
        "time, and feeds it the output so far each time). Ratios: "
        "xgrammar's time / triemask's (above 1: triemask faster; per step: the worse of inside and "
        "outside an enum). Inside an enum / bare set: the steps inside the enum's values and the bare "
        "set's steps on the same values, each walk run alone (the per-step column alternates with "
        "xgrammar's walk, whose work evicts triemask's tables between steps).",
        "",
        "| schema | trie fields | compile triemask (known) / xgrammar | ratio "
        "| new structure, warm: triemask / xgrammar | ratio | new description, warm | ratio "
        "| per step (us) triemask / xgrammar | ratio | inside an enum / bare set (us) "
        "| batch 64 (us) triemask / xgrammar | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = peer_ratios(results)
    for r in results["rows"]:
        name = r["name"]
        step = " ".join(
            f"{where}: {by['triemask']['median_us']:.1f} / {by['xgrammar']['median_us']:.1f} "
            f"(mean {by['triemask']['mean_us']:.1f} / {by['xgrammar']['mean_us']:.1f})"
            for where, by in r["per_step"].items()
            if by
        )
        batch = r["batch_64"]
        bare, alone = r.get("bare_set_per_step_us"), r.get("inside_alone_us")
        yardstick = f"{alone:.2f} / {bare:.2f} ({alone / bare:.1f}x)" if bare and alone else "-"
        warm = " | ".join(
            f"{r[f'triemask_new_{kind}_warm_s'] * 1e3:.1f} / {r[f'xgrammar_new_{kind}_warm_s'] * 1e3:.1f} ms "
            f"| {r[f'new_{kind}_warm_ratio']:.2f}x"
            if f"new_{kind}_warm_ratio" in r
            else "- | -"
            for kind in ("structure", "description")
        )
        lines.append(
            f"| {name} | {r['trie_fields']} | {r['triemask_compile_s'] * 1e3:.1f} "
            f"({r['triemask_known_structure_compile_s'] * 1e3:.1f}) / {r['xgrammar_compile_s'] * 1e3:.1f} ms "
            f"| {ratios[f'{name}: compile']:.2f}x | {warm} | {step} | {ratios[f'{name}: per step']:.2f}x | {yardstick} "
            + (
                f"| {batch['triemask_us']:.0f} / {batch['xgrammar_us']:.0f} | {ratios[f'{name}: batch 64']:.2f}x |"
                if "xgrammar_us" in batch
                else f"| {batch['triemask_us']:.0f} / - | - |"
            )
        )
    return "\n".join(lines) + "\n"


def threshold_sweep(options: argparse.Namespace) -> dict[str, Any]:
    """The default ``min_enum_values``: one enum field of K tool names next to an integer,
    compiled with the enum in a trie and left to xgrammar, compile time and per step."""
    loaded = vocabs.load(VOCAB)
    compiler = Compiler(loaded.vocab)
    compiler.compile_json_schema(tool_call_schema(synthetic_tools(64)), **OPTIONS)  # the shared preparation
    row = np.zeros((1, (loaded.vocab.vocab_size + 31) // 32), dtype=np.int32)
    rows = []
    for k in (4, 8, 16, 32, 64, 128, 256, 512, 1024):
        names = synthetic_tools(k, seed=3)
        schema = {
            "type": "object",
            "properties": {"x": {"enum": names}, "n": {"type": "integer"}},
            "required": ["x", "n"],
        }
        (tokens,) = walk_tokens(loaded, [{"x": names[k // 2], "n": 5}])
        found: dict[str, Any] = {"k": k}
        for label, threshold in (("trie", 1), ("xgrammar", 1 << 30)):

            def build(threshold: int = threshold, schema: dict[str, Any] = schema) -> Any:
                clear_structure_cache()  # a first compile of the structure, as xgrammar's (cache off)
                return compiler.compile_json_schema(schema, min_enum_values=threshold, **OPTIONS)

            compiled = build()
            found[f"{label}_compile_ms"] = median_time(build, options.repeats) * 1e3

            def walk(compiled: Any = compiled, tokens: list[int] = tokens) -> None:
                matcher = Matcher(compiled)
                for token in tokens:
                    matcher.fill_next_token_bitmask(row)
                    matcher.accept_token(token)

            found[f"{label}_step_us"] = median_time(walk, options.repeats) / len(tokens) * 1e6
        rows.append(found)
        log(f"threshold K = {k}: {found}")
    return {"vocabulary": VOCAB, "options": OPTIONS, "rows": rows}


def markdown(results: dict[str, Any]) -> str:
    def ms(x: Any) -> str:
        return f"{x * 1e3:,.1f} ms" if isinstance(x, float) else str(x).split(" (")[0]

    def us(x: Any) -> str:
        return f"{x:.1f}" if isinstance(x, float) and x == x else "-"

    header = (
        "| scenario | compile: triemask (known structure) | xgrammar | llguidance | vs xgrammar "
        "| inside an enum (us): triemask / bare set / xgrammar / llguidance "
        "| outside (us): triemask / xgrammar / llguidance | batch 128 (us): triemask / xgrammar "
        "| tokens that differ |"
    )
    lines = [
        "# Mixed schemas: triemask vs xgrammar and llguidance",
        "",
        f"Vocabulary {results['vocabulary']}, compact JSON; per-vocabulary preparation "
        f"(once, shared by every schema): {results['preparation_s']:.2f} s. Per step: fill one row + accept.",
        "",
        header,
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["scenarios"]:
        inside, outside = r["per_step"].get("inside", {}), r["per_step"].get("outside", {})

        def step(by: dict[str, Any], engine: str) -> str:
            return us(by[engine]["median_us"]) if engine in by else "-"

        ratio = r.get("compile_ratio_xgrammar")
        check = r.get("cross_check")
        batch = r["batch_128"]
        cells = [
            r["name"],
            f"{ms(r['triemask_compile_s'])} ({ms(r.get('triemask_known_structure_compile_s'))})",
            ms(r["xgrammar_compile_s"]),
            ms(r["llguidance_compile_s"]),
            f"{ratio:,.0f}x" if ratio else "-",
            " / ".join(
                [
                    step(inside, "triemask"),
                    us(r.get("bare_set_per_step_us")),
                    step(inside, "xgrammar"),
                    step(inside, "llguidance"),
                ]
            ),
            " / ".join(step(outside, e) for e in ("triemask", "xgrammar", "llguidance")),
            f"{us(batch['triemask_us'])} / {us(batch.get('xgrammar_us'))}",
            f"{check['differing_tokens']} in {check['steps']} steps" if check else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    pauses = [(r["name"], r["tool_pause"]) for r in results["scenarios"] if "tool_pause" in r]
    if pauses:
        lines += ["", "Pause at the first argument token of a tool whose arguments were not compiled yet:", ""]
        lines += [
            f"- {name}: {p['uncached_pause_ms']:.1f} ms (the slowest fill once cached: "
            f"{p['cached_slowest_fill_ms']:.1f} ms)"
            for name, p in pauses
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks schemas", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a few minutes)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--step-repeats", type=int, default=5)
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--walks", type=int, default=6)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for one xgrammar compile in a child")
    parser.add_argument("--xgrammar-compile", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--threshold", action="store_true", help="only the sweep behind DEFAULT_MIN_ENUM_VALUES")
    parser.add_argument("--peers", action="store_true", help="only the ordinary schemas against xgrammar")
    options = parser.parse_args(argv)
    if options.peers:
        options.out.mkdir(parents=True, exist_ok=True)
        table = peer_table(options)
        (options.out / "schemas-peers.json").write_text(json.dumps(table, indent=1) + "\n")
        (options.out / "schemas-peers.md").write_text(peer_markdown(table))
        print(peer_markdown(table))
        return
    if options.threshold:
        options.out.mkdir(parents=True, exist_ok=True)
        sweep = threshold_sweep(options)
        (options.out / "schemas-threshold.json").write_text(json.dumps(sweep, indent=1) + "\n")
        lines = [
            "| K | compile, trie (ms) | compile, xgrammar (ms) | per step, trie (us) | per step, xgrammar (us) |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['k']} | {r['trie_compile_ms']:.1f} | {r['xgrammar_compile_ms']:.1f} | "
            f"{r['trie_step_us']:.1f} | {r['xgrammar_step_us']:.1f} |"
            for r in sweep["rows"]
        ]
        (options.out / "schemas-threshold.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        return
    if options.xgrammar_compile:
        loaded = vocabs.load(VOCAB)
        peers = Peers(loaded.vocab)
        schema = json.loads(options.xgrammar_compile.read_text())
        t0 = time.perf_counter()
        peers.xgrammar(schema)
        print(time.perf_counter() - t0)
        return
    options.out.mkdir(parents=True, exist_ok=True)
    results = run(options)
    name = "schemas-quick" if options.quick else "schemas"
    (options.out / f"{name}.json").write_text(json.dumps(results, indent=1) + "\n")
    (options.out / f"{name}.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
