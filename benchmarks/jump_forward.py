"""Jump-forward decoding on SmolLM2-135M: forward passes and wall time per answer, with and without.

    python -m benchmarks.jump_forward [--out benchmarks/results] [--prompts 24]   (make bench-jump-forward)

Issue 28's measure: the same prompts, greedy, through triemask's own decoding loop
(``integrations.transformers.generate_constrained``: the model's KV cache kept, one prompt at
a time) three times: ``jump_forward=False`` (a forward pass per token), ``True`` (the text every
continuation shares goes in with the model's next token as a draft the model verifies: the
answers of the plain loop, in fewer passes) and ``"canonical"`` (the tokenizer's tokens of that
text taken as they are, all but the last: fewer passes again, answers that may differ).
Four tasks: ICD-10-CM codes (74,719) from their descriptions; a tool name of the 10,000-tool
registry; a tool call with arguments over the same registry (``compile_tools``, compact JSON,
a system message that shows the call's shape), its requests carrying the arguments' values as
users' requests do (an id, a query, a text, a priority) and its ids at most 40 characters long
(``maxLength``, as a registry that knows its ids' format bounds them); and the same calls from
requests that name only the action ("Archive a release."), ids unbounded: the model invents the
arguments, and a small one may write an id until ``max_new_tokens`` runs out (free text, where
nothing is forced, leaving a valid prefix). Every answer is checked: complete within
``max_new_tokens`` (a member; JSON that parses), and valid (a call of a registered tool whose
arguments validate). "Same answer" compares a run's texts with
the plain run's; "same decision" the code, the name, the called tool. The default model's converted
weights must be there (``make demo``).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import jsonschema

from triemask.datasets import load_icd10cm_descriptions, load_tool_registry, tool_specs

MODES: dict[bool | str, str] = {False: "plain", True: "verified", "canonical": "canonical"}  # (jump_forward)
SYSTEM_CALL = 'Answer with one tool call as JSON: {"name": "<tool name>", "arguments": {<its arguments>}}.'
ID_LENGTH = 40  # (maxLength of the ids in the calls whose requests carry their arguments)
# the values of the string arguments the requests carry, by property name
ARGUMENT_TEXTS = {
    "query": ("login timeout", "quarterly report", "failed payments", "stale branches"),
    "text": ("deploy finished", "please review the draft", "server is back up", "meeting moved to 3pm"),
}


def _request(number: int, spec: dict[str, Any]) -> str:
    """A request for ``spec``'s tool that carries its required arguments' values: an id
    (``REP-1074``), a query or a text, an enum's value ("low priority")."""
    function = spec["function"]
    parameters = function["parameters"]
    parts = []
    for key in parameters["required"]:
        schema = parameters["properties"][key]
        if "enum" in schema:
            parts.append(f"{schema['enum'][number % len(schema['enum'])]} {key}")
        elif key.endswith("_id"):
            parts.append(f"{key.replace('_', ' ')} {key[:3].upper()}-{1000 + 37 * number}")
        else:
            texts = ARGUMENT_TEXTS[key]
            parts.append(f'{key} "{texts[number % len(texts)]}"')
    return f"{function['description']}: {', '.join(parts)}."


def _with_bounded_ids(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with ``maxLength`` on its ``*_id`` string properties."""
    bounded = copy.deepcopy(spec)
    for key, schema in bounded["function"]["parameters"]["properties"].items():
        if key.endswith("_id"):
            schema["maxLength"] = ID_LENGTH
    return bounded


def _tasks(count: int) -> list[dict[str, Any]]:
    codes = load_icd10cm_descriptions()
    picked = list(codes.items())[:: max(1, len(codes) // count)][:count]
    names = load_tool_registry()
    specs = tool_specs(names)
    chosen = specs[:: max(1, len(specs) // count)][:count]
    return [
        {
            "task": "ICD-10-CM code",
            "values": list(codes),
            "prompts": [f"Which ICD-10-CM code is: {description}? Answer with the code." for _, description in picked],
            "system": "Answer with one ICD-10-CM code.",
            "max_new_tokens": 16,
        },
        {
            "task": "tool name (10,000)",
            "values": names,
            "prompts": [
                f"Which tool should {s['function']['description'].lower()}? Answer with its name." for s in chosen
            ],
            "system": "Answer with one tool name.",
            "max_new_tokens": 24,
        },
        {
            "task": "tool call with arguments (10,000)",
            "tools": [_with_bounded_ids(s) for s in specs],
            "prompts": [_request(number, s) for number, s in enumerate(chosen)],
            "system": SYSTEM_CALL,
            "max_new_tokens": 96,
        },
        {
            "task": "tool call, arguments invented (10,000)",
            "tools": specs,
            "prompts": [f"{s['function']['description']}." for s in chosen],
            "system": SYSTEM_CALL,
            "max_new_tokens": 96,
        },
    ]


def _decision(task: dict[str, Any], text: bytes) -> str:
    """What the answer decides: the value, or the called tool's name."""
    if "tools" not in task:
        return text.decode("utf-8", "replace")
    try:
        return str(json.loads(text)["name"])
    except (ValueError, KeyError, TypeError):
        return f"(incomplete) {text[:40]!r}"


def _complete(task: dict[str, Any], text: bytes) -> bool:
    """Whether the answer was finished within max_new_tokens (a member; JSON that parses)."""
    if "tools" not in task:
        return text.decode("utf-8", "replace") in task["member_set"]
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _valid(task: dict[str, Any], text: bytes, by_name: dict[str, Any]) -> bool:
    """A member of the set; a call of a registered tool whose arguments validate."""
    if "tools" not in task:
        return text.decode("utf-8") in task["member_set"]
    try:
        call = json.loads(text)
        jsonschema.validate(call["arguments"], by_name[call["name"]]["function"]["parameters"])
    except (ValueError, KeyError, TypeError, jsonschema.ValidationError):
        return False
    return True


def run(prompts: int) -> dict[str, Any]:
    import triemask
    from triemask.integrations.transformers import compiler_for, generate_constrained

    model, tokenizer = triemask.load_default_model()
    compiler = compiler_for(model, tokenizer)
    rows = []
    for task in _tasks(prompts):
        if "tools" in task:
            constraint: Any = compiler.compile_tools(task["tools"], any_whitespace=False)
            by_name = {s["function"]["name"]: s for s in task["tools"]}
        else:
            constraint, by_name = compiler.compile(task["values"]), {}
            task["member_set"] = set(task["values"])
        options = {"system": task["system"], "max_new_tokens": task["max_new_tokens"]}
        generate_constrained(model, tokenizer, task["prompts"][:1], constraint, **options)  # (warm)
        runs = {}
        for mode in MODES:
            started = time.perf_counter()
            decoded = generate_constrained(model, tokenizer, task["prompts"], constraint, jump_forward=mode, **options)
            runs[mode] = (decoded, time.perf_counter() - started)
        plain = runs[False][0]
        row: dict[str, Any] = {"task": task["task"], "prompts": len(task["prompts"])}
        for mode, (decoded, seconds) in runs.items():
            both = [
                i
                for i, (p, d) in enumerate(zip(plain, decoded, strict=True))
                if _complete(task, p.text) and _complete(task, d.text)
            ]
            row[MODES[mode]] = {
                "passes": statistics.mean(d.forward_passes for d in decoded),
                "tokens_jumped": statistics.mean(d.jumped_tokens for d in decoded),
                "seconds": seconds,
                "complete": sum(_complete(task, d.text) for d in decoded),
                "valid": sum(_valid(task, d.text, by_name) for d in decoded),
                # the answers complete here and in the plain run: passes and seconds on both sides
                "complete_both": len(both),
                "passes_complete": [
                    sum(r[i].forward_passes for i in both) / max(1, len(both)) for r in (plain, decoded)
                ],
                "seconds_complete": [sum(r[i].seconds for i in both) for r in (plain, decoded)],
                "same_answer": sum(p.text == d.text for p, d in zip(plain, decoded, strict=True)),
                "same_decision": sum(
                    _decision(task, p.text) == _decision(task, d.text) for p, d in zip(plain, decoded, strict=True)
                ),
                "differing": [
                    {"plain": p.text.decode("utf-8", "replace"), "jump_forward": d.text.decode("utf-8", "replace")}
                    for p, d in zip(plain, decoded, strict=True)
                    if p.text != d.text
                ],
            }
        rows.append(row)
        summary = {name: {k: row[name][k] for k in ("passes", "seconds", "same_answer")} for name in MODES.values()}
        print(row["task"], json.dumps(summary), flush=True)
    return {"model": "SmolLM2-135M-Instruct", "machine": platform.processor() or platform.machine(), "rows": rows}


def to_markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# Jump-forward decoding ({results['model']}, greedy, CPU)",
        "",
        "Forward passes per answer and wall time: plain (a pass per token) / verified drafts "
        '(`jump_forward=True`) / canonical tokens (`jump_forward="canonical"`); ratios against plain; '
        "answers complete (valid) and the same as plain's.",
        "",
        "| task | prompts | passes per answer | ratio | wall time | ratio | complete (valid) | same answer | "
        "same decision |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["rows"]:
        runs = [r[name] for name in MODES.values()]
        plain, jumped = runs[0], runs[1:]
        cells = [
            " / ".join(f"{x['passes']:.1f}" for x in runs),
            " / ".join(f"{plain['passes'] / x['passes']:.2f}x" for x in jumped),
            " / ".join(f"{x['seconds']:.1f}" for x in runs) + " s",
            " / ".join(f"{plain['seconds'] / x['seconds']:.2f}x" for x in jumped),
            " / ".join(f"{x['complete']} ({x['valid']})" for x in runs),
            " / ".join(str(x["same_answer"]) for x in jumped),
            " / ".join(str(x["same_decision"]) for x in jumped),
        ]
        lines.append(f"| {r['task']} | {r['prompts']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "The answers complete in both runs (a small model may write a string argument until `max_new_tokens` "
        "runs out: those answers are mostly free text, where nothing is forced): passes per answer and seconds, "
        "plain / jump-forward, with verified drafts and canonical tokens.",
        "",
        "| task | verified: answers | passes per answer | ratio | seconds | ratio "
        "| canonical: answers | passes per answer | ratio | seconds | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["rows"]:
        cells = []
        for x in (r[name] for name in list(MODES.values())[1:]):
            (plain_passes, passes), (plain_seconds, seconds) = x["passes_complete"], x["seconds_complete"]
            cells += [
                str(x["complete_both"]),
                f"{plain_passes:.1f} / {passes:.1f}",
                f"{plain_passes / passes:.2f}x",
                f"{plain_seconds:.1f} / {seconds:.1f}",
                f"{plain_seconds / seconds:.2f}x",
            ]
        lines.append(f"| {r['task']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--prompts", type=int, default=24)
    options = parser.parse_args()
    options.out.mkdir(parents=True, exist_ok=True)
    results = run(options.prompts)
    (options.out / "jump-forward.json").write_text(json.dumps(results, indent=2) + "\n")
    (options.out / "jump-forward.md").write_text(to_markdown(results))
    print(to_markdown(results))


if __name__ == "__main__":
    main()
