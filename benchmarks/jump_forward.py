"""Jump-forward decoding on SmolLM2-135M: forward passes and wall time per answer, with and without.

    python -m benchmarks.jump_forward [--out benchmarks/results] [--prompts 24]   (make bench-jump-forward)

Issue 28's measure: the same prompts, greedy, through triemask's own decoding loop
(``integrations.transformers.generate_constrained``: the model's KV cache kept, one prompt at
a time) once with ``jump_forward=False`` (a forward pass per token) and once with it on (the
text every continuation shares goes in with the model's next token, all but its last token).
Three tasks: ICD-10-CM codes (74,719) from their descriptions; a tool name of the 10,000-tool
registry; a tool call with arguments over the same registry (``compile_tools``, compact JSON,
a system message that shows the call's shape). Every answer is checked: complete within
``max_new_tokens`` (a member; JSON that parses; a small model may write a string argument until
the budget runs out, leaving a valid prefix), and valid (a call of a registered tool whose
arguments validate). "Same answer" compares the two runs'
texts; "same decision" the code, the name, the called tool. The default model's converted
weights must be there (``make demo``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import jsonschema

from triemask.datasets import load_icd10cm_descriptions, load_tool_registry, tool_specs

SYSTEM_CALL = 'Answer with one tool call as JSON: {"name": "<tool name>", "arguments": {<its arguments>}}.'


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
        for jump in (False, True):
            started = time.perf_counter()
            decoded = generate_constrained(model, tokenizer, task["prompts"], constraint, jump_forward=jump, **options)
            runs[jump] = (decoded, time.perf_counter() - started)
        (plain, plain_seconds), (jumped, jumped_seconds) = runs[False], runs[True]
        differing = [
            {"plain": p.text.decode("utf-8", "replace"), "jump_forward": j.text.decode("utf-8", "replace")}
            for p, j in zip(plain, jumped, strict=True)
            if p.text != j.text
        ]
        rows.append(
            {
                "task": task["task"],
                "prompts": len(task["prompts"]),
                "passes_plain": statistics.mean(d.forward_passes for d in plain),
                "passes_jump": statistics.mean(d.forward_passes for d in jumped),
                "tokens_jumped": statistics.mean(d.jumped_tokens for d in jumped),
                "seconds_plain": plain_seconds,
                "seconds_jump": jumped_seconds,
                "complete_plain": sum(_complete(task, d.text) for d in plain),
                "complete_jump": sum(_complete(task, d.text) for d in jumped),
                "valid_plain": sum(_valid(task, d.text, by_name) for d in plain),
                "valid_jump": sum(_valid(task, d.text, by_name) for d in jumped),
                "same_answer": len(plain) - len(differing),
                "same_decision": sum(
                    _decision(task, p.text) == _decision(task, j.text) for p, j in zip(plain, jumped, strict=True)
                ),
                "differing": differing,
            }
        )
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "differing"}), flush=True)
    return {"model": "SmolLM2-135M-Instruct", "machine": platform.processor() or platform.machine(), "rows": rows}


def to_markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# Jump-forward decoding ({results['model']}, greedy, CPU)",
        "",
        "| task | prompts | forward passes per answer, plain / jump-forward | ratio | wall time, plain / jump-forward "
        "| ratio | complete (valid), plain / jump-forward | same answer | same decision |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['task']} | {r['prompts']} | {r['passes_plain']:.1f} / {r['passes_jump']:.1f} | "
        f"{r['passes_plain'] / r['passes_jump']:.2f}x | {r['seconds_plain']:.1f} / {r['seconds_jump']:.1f} s | "
        f"{r['seconds_plain'] / r['seconds_jump']:.2f}x | {r['complete_plain']} ({r['valid_plain']}) / "
        f"{r['complete_jump']} ({r['valid_jump']}) | "
        f"{r['same_answer']} | {r['same_decision']} |"
        for r in results["rows"]
    ]
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
