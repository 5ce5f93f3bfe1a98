"""``triemask demo``: SmolLM2-135M-Instruct picks ICD-10-CM codes and tool names, and
calls tools with arguments.

Two large sets shipped with the package (74,719 codes, 10,000 tools) are compiled
against the model's vocabulary; each question is answered twice with the same prompt,
unconstrained and constrained, so the difference is the constraint alone. Then the
10,000 tools, each with a small argument schema (``datasets.tool_specs``), are compiled
as a tool list, and the model writes whole calls ``{"name": ..., "arguments": ...}``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from .. import datasets
from .evaluation import answer_line

# System messages; the question is the user message. The same for both answers.
SYSTEM = {
    "ICD-10-CM": "You are a medical coder. Reply with a single ICD-10-CM code.",
    "tools": "You route requests to tools. Reply with a single tool name such as slack.send_message or create_invoice.",
}

NOUNS = {"ICD-10-CM": "ICD-10-CM codes", "tools": "tool names"}


@dataclass(frozen=True)
class Question:
    set_name: str  # "ICD-10-CM" or "tools"
    text: str
    expected: str


QUESTIONS = (
    Question("ICD-10-CM", "Type 2 diabetes mellitus without complications", "E11.9"),
    Question("ICD-10-CM", "Essential (primary) hypertension", "I10"),
    Question("ICD-10-CM", "Acute upper respiratory infection", "J06.9"),
    Question("ICD-10-CM", "Urinary tract infection", "N39.0"),
    Question("tools", "Post a message in our Slack channel", "slack.send_message"),
    Question("tools", "Open a new Jira issue for this bug", "jira.create_issue"),
    Question("tools", "Download last month's Stripe invoice", "stripe.download_invoice"),
    Question("tools", "List the repositories in our GitHub organisation", "github.list_repository"),
)


CALL_SYSTEM = (
    'You call tools. Reply with one JSON object {"name": <a tool name such as slack.send_message>, '
    '"arguments": {...}} and nothing else.'
)
CALL_QUESTIONS = (
    "Post 'deploy finished' in our Slack channel, high priority",
    "Search Jira for issues about the login bug, 5 results as csv",
    "Get the GitHub user with id octocat",
)


def valid_call(call: Any, specs: dict[str, dict[str, Any]]) -> bool:
    """Whether ``call`` is ``{"name": <a tool>, "arguments": <valid for its parameters>}``
    (the keywords ``datasets.tool_specs`` uses: types, enums, bounds, required, no extras)."""

    def valid(value: Any, schema: dict[str, Any]) -> bool:
        if "enum" in schema:
            return value in schema["enum"]
        kind = schema.get("type")
        if kind == "string":
            return isinstance(value, str) and len(value) <= schema.get("maxLength", len(value))
        if kind == "integer":
            return type(value) is int and schema.get("minimum", value) <= value <= schema.get("maximum", value)
        if kind == "array":
            return (
                isinstance(value, list)
                and len(value) <= schema.get("maxItems", len(value))
                and all(valid(item, schema["items"]) for item in value)
            )
        if kind == "object":
            properties = schema.get("properties", {})
            return (
                isinstance(value, dict)
                and set(value) <= set(properties)
                and set(schema.get("required", [])) <= set(value)
                and all(valid(v, properties[k]) for k, v in value.items())
            )
        return False

    return (
        isinstance(call, dict)
        and set(call) == {"name", "arguments"}
        and call["name"] in specs
        and valid(call["arguments"], specs[call["name"]]["parameters"])
    )


def _parses(text: bytes) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def demo(limit: int | None = None) -> None:
    """Run the demo (``limit``: ask only the first questions)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TaskID,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.table import Table

    from ..integrations.transformers import (
        compiler_for,
        generate_constrained,
        generate_json,
        render_prompt,
        spelled_value,
    )
    from .model import load_default_model
    from .shared_prefix import SharedPrefixGenerator

    console = Console()
    questions = QUESTIONS[:limit]
    progress = Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
    )
    timings: dict[str, float] = {}

    def phase(description: str) -> TaskID:
        return progress.add_task(description, total=None)

    with progress:
        task = phase("loading SmolLM2-135M-Instruct (first run: de-quantising and caching it, ~30 s)")
        started = time.perf_counter()
        model, tokenizer = load_default_model()
        timings["model"] = time.perf_counter() - started
        progress.remove_task(task)

        task = phase("indexing the vocabulary (once per tokenizer)")
        started = time.perf_counter()
        compiler = compiler_for(model, tokenizer)
        timings["index"] = time.perf_counter() - started
        progress.remove_task(task)

        sets = {"ICD-10-CM": datasets.load_icd10cm(), "tools": datasets.load_tool_registry()}
        automata = {}
        for name, values in sets.items():
            task = phase(f"compiling {len(values):,} {NOUNS[name]}")
            started = time.perf_counter()
            automata[name] = compiler.compile(values)
            timings[name] = time.perf_counter() - started
            progress.remove_task(task)

        longest_bytes = {name: max(len(value.encode()) for value in values) for name, values in sets.items()}
        descriptions = datasets.load_icd10cm_descriptions()
        rows = []
        mask_steps, mask_seconds = 0, 0.0
        task = progress.add_task("asking the questions", total=len(questions))
        generator = SharedPrefixGenerator(model, tokenizer, "")  # no shared prefix worth caching here
        for question in questions:
            prompt = render_prompt(tokenizer, question.text, SYSTEM[question.set_name])
            automaton = automata[question.set_name]
            longest = longest_bytes[question.set_name]
            constrained = generator.generate(prompt, automaton=automaton, max_new_tokens=longest + 1)
            unconstrained = generator.generate(prompt, automaton=None, max_new_tokens=32, first_line=True)
            mask_steps += constrained.mask_steps
            mask_seconds += constrained.mask_seconds
            value = spelled_value(automaton, constrained.tokens)
            rows.append((question, value, unconstrained.text.strip()))
            progress.advance(task)

        task = phase("compiling 10,000 tools with their argument schemas")
        specs = datasets.tool_specs(sets["tools"])
        started = time.perf_counter()
        tools = compiler.compile_tools(specs, any_whitespace=False)
        timings["tool list"] = time.perf_counter() - started
        progress.remove_task(task)
        call_questions = CALL_QUESTIONS[: None if limit is None else max(1, limit // 3)]
        task = progress.add_task("asking for tool calls", total=len(call_questions))
        calls = []
        for text in call_questions:
            started = time.perf_counter()
            (call,) = generate_json(model, tokenizer, [text], tools, system=CALL_SYSTEM, max_new_tokens=200)
            seconds = time.perf_counter() - started
            prompt = render_prompt(tokenizer, text, CALL_SYSTEM)
            free = generator.generate(prompt, automaton=None, max_new_tokens=64).text.strip()
            calls.append((text, call, seconds, free))
            progress.advance(task)
        task = phase("the same tool calls in triemask's own loop, without and with jump-forward")
        jumps = {
            jump: generate_constrained(
                model, tokenizer, call_questions, tools, jump_forward=jump, system=CALL_SYSTEM, max_new_tokens=200
            )
            for jump in (False, True)
        }
        progress.remove_task(task)

    members = {name: set(values) for name, values in sets.items()}
    table = Table(title="The same prompt, without and with triemask", show_lines=True)
    table.add_column("set")
    table.add_column("question (expected)", ratio=3)
    table.add_column("triemask", overflow="fold", ratio=2)
    table.add_column("unconstrained", ratio=3)
    table.add_column("valid")
    for question, value, free in rows:
        shown = value or "(none)"
        if question.set_name == "ICD-10-CM" and value in descriptions:
            shown += f"\n[dim]{descriptions[value]}[/dim]"
        valid = answer_line(free) in members[question.set_name]
        table.add_row(
            question.set_name,
            f"{question.text}\n[dim]({question.expected})[/dim]",
            f"[green]{shown}[/green]" if value in members[question.set_name] else f"[red]{shown}[/red]",
            (free[:100] + "…" if len(free) > 100 else free) or "(empty)",
            "[green]yes[/green]" if valid else "[red]no[/red]",
        )
    console.print(table)

    by_name: dict[str, dict[str, Any]] = {spec["function"]["name"]: spec["function"] for spec in specs}  # type: ignore[index,misc]
    table = Table(title="Tool calls with arguments, 10,000 tools: without and with triemask", show_lines=True)
    table.add_column("request", ratio=2)
    table.add_column("triemask", overflow="fold", ratio=3)
    table.add_column("unconstrained", overflow="fold", ratio=3)
    table.add_column("valid")
    calls_valid = free_calls_valid = 0
    for text, call, _, free in calls:
        ok = valid_call(call, by_name)
        try:
            free_ok = valid_call(json.loads(free), by_name)
        except ValueError:
            free_ok = False
        calls_valid += ok
        free_calls_valid += free_ok
        table.add_row(
            text,
            f"[green]{json.dumps(call)}[/green]" if ok else f"[red]{json.dumps(call)}[/red]",
            (free[:160] + "…" if len(free) > 160 else free) or "(empty)",
            f"triemask {'[green]yes[/green]' if ok else '[red]no[/red]'}, "
            f"unconstrained {'[green]yes[/green]' if free_ok else '[red]no[/red]'}",
        )
    console.print(table)
    tool_stats = tools.stats()
    console.print(
        f"compiled 10,000 tools as a tool list in {timings['tool list'] * 1e3:.0f} ms (with the one-time JSON "
        "preparation of the vocabulary; name trie, "
        f"{tool_stats['memory_bytes'] / 1e6:.1f} MB); argument schemas compiled on first use: "
        f"{tool_stats['tools']['misses']} in {tool_stats['tools']['compile_seconds'] * 1e3:.0f} ms; "
        f"valid calls: triemask {calls_valid}/{len(calls)}, unconstrained {free_calls_valid}/{len(calls)}"
    )

    def summary(decoded: list[Any]) -> str:
        complete = [json.loads(d.text) for d in decoded if _parses(d.text)]
        return (
            f"{sum(d.forward_passes for d in decoded) / len(decoded):.1f} forward passes per call, "
            f"{sum(d.seconds for d in decoded):.1f} s, {sum(valid_call(c, by_name) for c in complete)}/{len(decoded)} "
            "complete and valid"
        )

    same = sum(p.tokens == j.tokens for p, j in zip(jumps[False], jumps[True], strict=True))
    console.print(
        f"tool calls with jump-forward (forced text drafted into the pass of the model's next token, "
        f"verified by the model): {summary(jumps[True])}; without: {summary(jumps[False])}; "
        f"the same calls: {same}/{len(jumps[True])}"
    )
    constrained_valid = sum(value is not None and value in members[q.set_name] for q, value, _ in rows)
    free_valid = sum(answer_line(free) in members[q.set_name] for q, _, free in rows)
    correct = sum(value == q.expected for q, value, _ in rows)
    for name, automaton in automata.items():
        stats = automaton.stats()
        console.print(
            f"compiled {stats['values']:,} {NOUNS[name]} in {timings[name] * 1e3:.0f} ms: "
            f"{stats['trie_nodes']:,} trie nodes, {stats['edges']:,} allowed (node, token) pairs, "
            f"{stats['memory_bytes'] / 1e6:.1f} MB"
        )
    console.print(
        f"model loaded in {timings['model']:.1f} s; vocabulary indexed in {timings['index']:.2f} s "
        f"({compiler.vocab.vocab_size:,} tokens)"
    )
    if mask_steps:
        console.print(
            f"set constraint: {mask_seconds / mask_steps * 1e6:.0f} us per step on average over {mask_steps} steps "
            "(row states and masking the logits tensor, measured inside generate)"
        )
    console.print(
        f"valid answers: triemask {constrained_valid}/{len(rows)}, unconstrained {free_valid}/{len(rows)}; "
        f"expected answer chosen with triemask: {correct}/{len(rows)} "
        "(a 135M-parameter model: the constraint guarantees membership, not knowledge)"
    )
    if constrained_valid != len(rows):  # pragma: no cover - the constraint makes this impossible
        raise SystemExit("a constrained answer was not a member of its set")
    if calls_valid != len(calls):  # pragma: no cover - the constraint makes this impossible
        raise SystemExit("a constrained tool call was not valid for its tool")
