"""The benchmark suite's own machinery, without any peer installed: union syntaxes, decoding
paths, the token-trie baseline, timing helpers, the cross-check, the timeout of a compile
sweep, and the report. (Peer timings live in `make bench`, never in tests.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from benchmarks import jump_forward, report, schemas, serving_tools
from benchmarks.measure import (
    batch_step_seconds,
    compile_sweep,
    cross_check,
    decoding_paths,
    per_step_seconds,
)
from benchmarks.peers import TokenTrieEngine, TriemaskEngine, ebnf_union, lark_union, regex_union

from conftest import byte_vocabulary
from triemask.datasets import synthetic_products

VALUES = ["get", "get_user", "a.b|c", "x+y*(z)?", "[q]{1}^$", "tab\there", 'say "hi" \\o/', "naïve 🦙", "a-b~c#d&e"]


def test_regex_union_matches_exactly_the_values() -> None:
    pattern = re.compile(regex_union(VALUES))
    assert all(pattern.fullmatch(value) for value in VALUES)
    assert not any(pattern.fullmatch(other) for other in ["ge", "get_", "aXb|c", "xy", "a.b", "a-b~c#d&"])
    # Rust's regex syntax rejects escaped letters, digits and spaces: only metacharacters are escaped.
    assert regex_union(["a b1"]) == "(a b1)"


def test_grammar_unions_are_json_quoted() -> None:
    assert ebnf_union(["a", 'b"c']) == 'root ::= "a" | "b\\"c"'
    assert lark_union(["naïve"]) == 'start: "naïve"'


@pytest.fixture(scope="module")
def engine() -> TriemaskEngine:
    return TriemaskEngine(byte_vocabulary([b"ge", b"get", b"_u", b"ser", b"user", b"na", "ï".encode()]))


def test_decoding_paths_spell_the_values_longest_first(engine: TriemaskEngine) -> None:
    automaton = engine.compile(VALUES)
    paths = decoding_paths(automaton, engine.vocab, VALUES, n=len(VALUES), seed=0)
    eos = engine.vocab.eos_token_ids[0]
    spelled = sorted(engine.vocab.decode(path[:-1]).decode() for path in paths)
    assert spelled == sorted(VALUES) and all(path[-1] == eos for path in paths)
    user = next(p for p in paths if engine.vocab.decode(p[:-1]) == b"get_user")
    assert [engine.vocab.token_bytes(t) for t in user[:-1]] == [b"get", b"_u", b"ser"]


def test_timings_and_cross_check_run_on_the_same_states(engine: TriemaskEngine) -> None:
    automaton = engine.compile(VALUES)
    paths = decoding_paths(automaton, engine.vocab, VALUES, n=4, seed=1)
    assert per_step_seconds(engine, automaton, paths, repeats=2) > 0
    batch = batch_step_seconds(engine, automaton, paths, batch=6, steps=9, repeats=2)
    assert 0 < batch["fill_s"] <= batch["step_s"]
    same = cross_check(engine, automaton, TriemaskEngine(engine.vocab), automaton, paths, VALUES)
    assert same["states"] == sum(map(len, paths)) and same["disagreements"] == 0


def test_cross_check_reports_where_the_token_trie_differs(engine: TriemaskEngine) -> None:
    """The GENRE baseline allows only the canonical tokenization: a strict subset, reported."""
    vocab = engine.vocab
    tokens = {vocab.token_bytes(i): i for i in range(len(vocab)) if vocab.token_bytes(i) is not None}
    canonical = {"get_user": [tokens[b"get"], tokens[b"_u"], tokens[b"ser"]], "get": [tokens[b"get"]]}
    genre = TokenTrieEngine(vocab, lambda values: [canonical[v] for v in values])
    trie = genre.compile(["get_user", "get"])
    assert len(trie.children) == 6  # root, get, get_u, get_user and one EOS leaf per value
    automaton = engine.compile(["get_user", "get"])
    paths = [[*canonical["get_user"], vocab.eos_token_ids[0]]]
    check = cross_check(engine, automaton, genre, trie, paths, ["get_user", "get"])
    assert check["disagreements"] == check["peer_strict_subset"] > 0
    first = check["examples"][0]
    assert first["text"] == "" and tokens[b"ge"] in first["only_triemask"] and not first["only_peer"]


def test_compile_sweep_measures_in_a_child_and_times_out() -> None:
    done = compile_sweep("triemask", "qwen2.5", "tools", [10, 100], timeout=120)
    assert done["prepare_s"] > 0
    for entry in done["sizes"].values():
        assert entry["status"] == "ok" and entry["compile_s"] > 0 and entry["memory_bytes"] > 0
    late = compile_sweep("triemask", "qwen2.5", "tools", [100_000], timeout=0.001)
    assert late["sizes"]["100000"] == {"status": "timeout", "timeout_s": 0.001}


def test_synthetic_products() -> None:
    products = synthetic_products(1_500, seed=3)
    assert len(set(products)) == 1_500 and products == synthetic_products(1_500, seed=3)
    assert all(re.fullmatch(r"[^>]+ > [^>]+ > \w+ \d{4} > [\w ]+", p) for p in products)
    with pytest.raises(ValueError, match="k must lie in"):
        synthetic_products(-1)


def _sweep(engine: str, times: dict[int, float | str]) -> dict[str, object]:
    sizes: dict[str, object] = {}
    for k, value in times.items():
        if value == "timeout":
            sizes[str(k)] = {"status": "timeout", "timeout_s": 60}
        elif value == "error":
            sizes[str(k)] = {"status": "error", "error": "PanicException: boom"}
        else:
            sizes[str(k)] = {"status": "ok", "first_s": value, "compile_s": value, "rss_delta_bytes": 0}
            sizes[str(k)]["memory_bytes"] = 1_000 if engine == "triemask" else None  # type: ignore[index]
    return {"engine": engine, "prepare_s": 0.5, "sizes": sizes}


def test_report_states_ratios_timeouts_and_targets(tmp_path) -> None:  # type: ignore[no-untyped-def]
    step = {"per_step_s": 2e-6, "batch": {"128": {"fill_s": 1e-4, "step_s": 2e-4}}}
    peer = {
        "per_step_s": 4e-6,
        "batch": {"128": {"fill_s": 2e-3, "step_s": 3e-3}},
        "cross_check": {"states": 10, "disagreements": 2, "peer_strict_subset": 2, "examples": []},
    }
    results = {
        "run": "quick",
        "date": "today",
        "seconds": 1.0,
        "vocabulary": "qwen2.5",
        "machine": {"cpu": "cpu", "cores": 2, "memory_gib": 1, "platform": "p", "python": "3"},
        "versions": {"triemask": "0"},
        "compile": {
            "triemask": _sweep("triemask", {1_000: 0.003, 10_000: 0.03}),
            "llguidance": _sweep("llguidance", {1_000: 0.009, 10_000: 0.12}),
            "outlines-core": _sweep("outlines-core", {1_000: "timeout", 10_000: "error"}),
        },
        "decode": {"1000": {"paths": 1, "steps": 10, "engines": {"triemask": step, "llguidance": peer}}},
    }
    text = report.markdown(results)
    assert "| 10,000 | 30 ms | 120 ms | error | 4x | - |" in text
    assert "timeout (>60 s)" in text and "2 / 10 (2 subset)" in text
    assert "| compile vs llguidance best, K=10,000 | 4x | >= 3x | met |" in text
    assert "| batch fill B=128 vs llguidance, K=1,000 | 20x | >= 20x | met |" in text
    summary = report.summary(results)
    assert "per-step" in summary and "target" in summary
    json.dumps(results)  # the results stay serialisable
    assert report._peer_ratio(results, "1000", ["llguidance"]) == pytest.approx(3.0)


def test_bench_check_flags_a_fallen_ratio(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from benchmarks import check

    run = {
        "decode": {
            "1000": {
                "engines": {
                    "triemask": {"per_step_s": 1e-6, "batch": {"128": {"fill_s": 1e-4}}},
                    "xgrammar": {"per_step_s": 4e-6, "batch": {"128": {"fill_s": 4e-4}}},
                }
            }
        }
    }
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps(run))
    assert check.ratios(run) == {"per-step <= xgrammar, K=1,000": 4.0, "batch fill B=128 vs xgrammar, K=1,000": 4.0}
    slower = json.loads(json.dumps(run))
    slower["decode"]["1000"]["engines"]["triemask"]["per_step_s"] = 3e-6  # 4x -> 1.33x: below 4 / 2
    fresh = tmp_path / "fresh.json"
    fresh.write_text(json.dumps(slower))
    step = {"triemask": {"median_us": 5.0}, "xgrammar": {"median_us": 5.0}}
    table = {
        "rows": [
            {
                "name": "labels",
                "triemask_compile_s": 0.01,
                "xgrammar_compile_s": 0.1,
                "per_step": {"inside": step, "outside": {**step, "triemask": {"median_us": 4.0}}},
                "batch_64": {"triemask_us": 100.0, "xgrammar_us": 100.0},
            }
        ]
    }
    schemas_run = tmp_path / "schemas.json"
    schemas_run.write_text(json.dumps(table))
    assert check.schemas.peer_ratios(table) == {
        "labels: compile": pytest.approx(10.0),
        "labels: per step": 1.0,  # the worse of inside and outside
        "labels: batch 64": 1.0,
    }
    # a run with pairs: the median of the pairs' ratios, not the ratio of the medians
    paired = {**table["rows"][0], "compile_ratio": 9.0, "batch_64": {"triemask_us": 100.0, "xgrammar_us": 100.0}}
    paired["batch_64"]["ratio"] = 1.02
    paired |= {"new_structure_warm_ratio": 0.98, "new_description_warm_ratio": 30.0}
    assert check.schemas.peer_ratios({"rows": [paired]}) == {
        "labels: compile": 9.0,
        "labels: new structure, warm": 0.98,
        "labels: new description, warm": 30.0,
        "labels: per step": 1.0,
        "labels: batch 64": 1.02,
    }
    pattern = {"format": "uuid", "xgrammar_s": 1e-3, "llguidance_s": 6e-4, "triemask_cold_s": 3e-4}
    patterns = {"rows": [{**pattern, "vocabulary": "qwen2.5", "triemask_lazy_s": 1e-4}]}
    assert check.formats.peer_ratios(patterns) == {
        "uuid (qwen2.5): eager": pytest.approx(2.0),
        "uuid (qwen2.5): lazy": pytest.approx(6.0),
    }
    formats_run = tmp_path / "formats.json"
    formats_run.write_text(json.dumps(patterns))
    same_formats = ["--formats-baseline", str(formats_run), "--formats-results", str(formats_run)]
    both = ["--schemas-baseline", str(schemas_run), "--schemas-results", str(schemas_run), *same_formats]
    assert check.main(["--baseline", str(baseline), "--results", str(baseline), *both]) == 0
    assert check.main(["--baseline", str(baseline), "--results", str(fresh), *both]) == 1
    table["rows"][0]["batch_64"]["triemask_us"] = 300.0  # 1x -> 0.33x: below 1 / 2
    slower_schemas = tmp_path / "slower-schemas.json"
    slower_schemas.write_text(json.dumps(table))
    with_slower = ["--schemas-baseline", str(schemas_run), "--schemas-results", str(slower_schemas), *same_formats]
    assert check.main(["--baseline", str(baseline), "--results", str(baseline), *with_slower]) == 1
    patterns["rows"][0]["triemask_lazy_s"] = 4e-4  # 6x -> 1.5x: below 6 / 2
    slower_formats = tmp_path / "slower-formats.json"
    slower_formats.write_text(json.dumps(patterns))
    same_schemas = ["--schemas-baseline", str(schemas_run), "--schemas-results", str(schemas_run)]
    with_slower = [*same_schemas, "--formats-baseline", str(formats_run), "--formats-results", str(slower_formats)]
    assert check.main(["--baseline", str(baseline), "--results", str(baseline), *with_slower]) == 1


def test_warm_variants_change_the_grammar_or_only_the_text() -> None:
    """The schemas benchmark's warm columns: each structural variant is a grammar not seen
    before, each description variant the same grammar as the schema's."""
    xgrammar = pytest.importorskip("xgrammar")

    def grammar(schema: dict[str, object]) -> str:
        return str(xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False))

    tools = schemas.vllm_required_schema(schemas.tool_specs(schemas.load_tool_registry())[:3])
    for schema in (tools, schemas.FUNCTION_ARGUMENTS, schemas.labels_schema(synthetic_products(5))):
        seen = {grammar(schema), *(grammar(schemas.structural_variant(schema, i)) for i in range(3))}
        assert len(seen) == 4
        assert grammar(schemas.description_variant(schema, 7)) == grammar(schema)


def test_serving_tools_report_is_the_committed_results_table() -> None:
    """The vLLM first-answer benchmark (run in the vLLM environment) writes its table from its
    JSON: the committed pair agree, and every row has both backends."""
    results_folder = Path(__file__).parent.parent / "benchmarks" / "results"
    results = json.loads((results_folder / "serving-tools.json").read_text())
    assert serving_tools.to_markdown(results) == (results_folder / "serving-tools.md").read_text()
    assert {(r["backend"], r["tools"]) for r in results["rows"]} == {
        (backend, count) for backend in serving_tools.BACKENDS for count in serving_tools.TOOL_COUNTS
    }


def test_jump_forward_report_is_the_committed_results_table() -> None:
    """The SmolLM2 jump-forward benchmark writes its table from its JSON: the committed pair agree."""
    results_folder = Path(__file__).parent.parent / "benchmarks" / "results"
    results = json.loads((results_folder / "jump-forward.json").read_text())
    assert jump_forward.to_markdown(results) == (results_folder / "jump-forward.md").read_text()
    assert [r["task"] for r in results["rows"]] == [t["task"] for t in jump_forward._tasks(2)]
