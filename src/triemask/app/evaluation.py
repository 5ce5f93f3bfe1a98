"""``triemask eval``: accuracy and validity on a real model (paper, section 5.3).

Table 6: TREC, MASSIVE, Banking77 and CLINC150 with four methods and the prompts of
appendix C.1. PE is unconstrained and its answer fuzzy-matched to the label set;
PE + trie is the same prompt with the set constraint; think + PE and think + trie share
one unconstrained reasoning phase and differ only in whether the answer is constrained.

Table 16 (appendix H.11): validity against K on synthetic tool selection, with the
catalogue described in the prompt (its namespaces, actions and resources) rather than
listed, so that K = 5,000 fits the default model's 8,192-token context.

Both tables also decode their constrained answers (PE + trie, trie) in triemask's own loop
without and with jump-forward (``generate_constrained``): forward passes per answer and wall
time, and how many answers came out the same (all of them, greedy, with verified drafts).
"""

from __future__ import annotations

import difflib
import os
import random
import re
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import datasets

# Appendix C.1, verbatim.
PE_PROMPT = (
    "Select exactly one of the following options.\n"
    "Output ONLY the option itself, nothing else.\n\n"
    "Options: {options}\n\n"
    "Text: {text}\n"
    "Answer:"
)
THINK_PROMPT = "Options: {options}\n\nText: {text}\nLet me think step by step:"
THINK_ANSWER_PROMPT = (
    "Select exactly one of the following options.\n"
    "Output ONLY the option itself, nothing else.\n\n"
    "Options: {options}\n\n"
    "Text: {text}\n"
    "Thinking: {thinking}\n"
    "Answer:"
)
# Table 16: the registry is described, not listed (see the module docstring).
TOOL_PROMPT = (
    "Select exactly one tool for the request.\n"
    "Output ONLY the tool name, nothing else.\n\n"
    "Tool names are <namespace>.<action>_<resource> or <action>_<resource>.\n"
    "Namespaces: {namespaces}\n"
    "Actions: {actions}\n"
    "Resources: {resources}\n\n"
    "Request: {text}\n"
    "Answer:"
)

METHODS = ("PE", "PE + trie", "think + PE", "think + trie")
TOOL_METHODS = ("unconstrained", "trie")
TOOL_K = (500, 1_000, 2_000, 5_000)


@dataclass
class Outcome:
    """One answer: what the model wrote, the label it counts as, and whether it was valid."""

    output: str
    prediction: str | None
    valid: bool  # the answer itself (first line, trimmed) is a member of the set
    seconds: float


@dataclass
class Example:
    text: str
    label: str
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    thinking: str | None = None


# --------------------------------------------------------------------------- answers


def answer_line(output: str) -> str:
    """The answer in an unconstrained output: its first non-empty line, without the
    quotes, backticks, brackets and final full stop models often wrap it in."""
    for line in output.splitlines():
        line = line.strip().removesuffix(".").strip(" `'\"*[]()")
        if line:
            return line
    return ""


def match_label(output: str, labels: Sequence[str]) -> tuple[str | None, bool]:
    """Fuzzy-match an unconstrained output to the set (paper, appendix C.1).

    Returns ``(label, valid)``: ``valid`` when the answer line is exactly a label;
    otherwise the longest label written in the output as a whole word, else the
    closest label by ``difflib`` ratio (at least 0.6), else ``None``.
    """
    answer = answer_line(output)
    members = set(labels)
    if answer in members:
        return answer, True
    written = [label for label in labels if re.search(rf"(?<![\w:.]){re.escape(label)}(?![\w:])", output)]
    if written:
        return max(written, key=len), False
    close = difflib.get_close_matches(answer, labels, n=1, cutoff=0.6)
    return (close[0] if close else None), False


def stratified_sample(rows: Sequence[dict[str, str]], n: int | None, seed: int) -> list[dict[str, str]]:
    """``n`` rows spread evenly over the labels (round robin over the labels in a
    seeded order, rows shuffled within each label); all rows when ``n`` is None."""
    if n is None or n >= len(rows):
        return list(rows)
    rng = random.Random(seed)
    by_label: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        by_label.setdefault(row["label"], []).append(row)
    groups = list(by_label.values())
    for group in groups:
        rng.shuffle(group)
    rng.shuffle(groups)
    chosen: list[dict[str, str]] = []
    depth = 0
    while len(chosen) < n:
        chosen += [group[depth] for group in groups if depth < len(group)][: n - len(chosen)]
        depth += 1
    return chosen


# --------------------------------------------------------------------------- tools (Table 16)

_SERVICE_NAMES = {"github": "GitHub", "aws": "AWS", "gitlab": "GitLab", "hubspot": "HubSpot", "gcp": "GCP"}
_REQUESTS = {
    "get": "Get the {resource}{where}.",
    "create": "Create a new {resource}{where}.",
    "update": "Update the {resource}{where}.",
    "delete": "Delete the {resource}{where}.",
    "list": "List every {resource}{where}.",
    "search": "Search for {a} {resource}{where}.",
    "send": "Send {a} {resource}{where}.",
    "fetch": "Fetch the latest {resource}{where}.",
    "upload": "Upload {a} {resource}{where}.",
    "download": "Download the {resource}{where}.",
}


def tool_request(name: str) -> str:
    """A plain-language request that the tool ``name`` answers."""
    namespace, _, rest = name.rpartition(".")
    action, _, resource = rest.partition("_")
    where = f" in {_SERVICE_NAMES.get(namespace, namespace.capitalize())}" if namespace else ""
    article = "an" if resource[0] in "aeiou" else "a"
    return _REQUESTS[action].format(resource=resource, where=where, a=article)


# --------------------------------------------------------------------------- running


@dataclass
class Settings:
    datasets: Sequence[str] = datasets.LABEL_SETS
    per_dataset: int | None = 10  # None: the whole test set
    tool_k: Sequence[int] = TOOL_K
    per_k: int = 15
    think_tokens: int = 300  # phase 1 budget (appendix C.1)
    answer_tokens: int = 48  # unconstrained answers (they stop at the end of their first line)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in self.datasets:
            if name not in datasets.LABEL_SETS:
                raise ValueError(f"unknown dataset {name!r}; choose from {', '.join(datasets.LABEL_SETS)}")
        for k in self.tool_k:
            datasets.tool_catalogue(k)  # raises for a K it cannot build
        counts = {"per_k": self.per_k, "think_tokens": self.think_tokens, "answer_tokens": self.answer_tokens}
        if self.per_dataset is not None:
            counts["per_dataset"] = self.per_dataset
        for field_name, count in counts.items():
            if count < 1:
                raise ValueError(f"{field_name} must be at least 1, got {count}")
        if self.tool_k and self.per_k > min(self.tool_k):
            raise ValueError(f"per_k={self.per_k} exceeds the smallest tool set (K={min(self.tool_k)})")


def evaluate(
    model: Any, tokenizer: Any, settings: Settings, progress: Callable[[str, int], Iterator[int]] | None = None
) -> dict[str, Any]:
    """Run Tables 6 and 16 and return the results (JSON-ready).

    ``progress(description, total)`` yields ``range(total)`` while showing progress.
    """
    import torch

    from ..integrations.transformers import compiler_for, render_prompt
    from .shared_prefix import SharedPrefixGenerator

    steps = progress or (lambda _description, total: iter(range(total)))
    compiler = compiler_for(model, tokenizer)
    started = time.perf_counter()
    mask_steps, mask_seconds = 0, 0.0

    def render(prompt: str) -> str:
        return render_prompt(tokenizer, prompt, None)

    table6: dict[str, Any] = {}
    for name in settings.datasets:
        labels = datasets.load_labels(name)
        automaton = compiler.compile(labels)
        longest = max(len(label.encode()) for label in labels)
        test_rows = datasets.load_test_set(name)
        rows = stratified_sample(test_rows, settings.per_dataset, settings.seed)
        options = ", ".join(labels)
        answer_prefix = render(PE_PROMPT.format(options=options, text="\0")).split("\0")[0]
        think_prefix = render(THINK_PROMPT.format(options=options, text="\0")).split("\0")[0]
        answering = SharedPrefixGenerator(model, tokenizer, answer_prefix)
        thinking = SharedPrefixGenerator(model, tokenizer, think_prefix)
        examples = [Example(text=row["text"], label=row["label"]) for row in rows]
        for index in steps(f"{name} (K={len(labels)})", len(examples)):
            example = examples[index]
            prompt = render(PE_PROMPT.format(options=options, text=example.text))
            example.outcomes["PE"] = _unconstrained(answering, prompt, labels, settings.answer_tokens)
            example.outcomes["PE + trie"], used = _constrained(answering, prompt, automaton, longest)
            mask_steps, mask_seconds = mask_steps + used[0], mask_seconds + used[1]
            t0 = time.perf_counter()
            reasoning = thinking.generate(
                render(THINK_PROMPT.format(options=options, text=example.text)),
                automaton=None,
                max_new_tokens=settings.think_tokens,
            ).text.strip()
            think_seconds = time.perf_counter() - t0
            example.thinking = reasoning
            prompt = render(THINK_ANSWER_PROMPT.format(options=options, text=example.text, thinking=reasoning))
            outcome = _unconstrained(answering, prompt, labels, settings.answer_tokens)
            outcome.seconds += think_seconds
            example.outcomes["think + PE"] = outcome
            outcome, used = _constrained(answering, prompt, automaton, longest)
            outcome.seconds += think_seconds
            example.outcomes["think + trie"] = outcome
            mask_steps, mask_seconds = mask_steps + used[0], mask_seconds + used[1]
        table6[name] = {
            "K": len(labels),
            "test_rows": len(test_rows),
            "sample": len(examples),
            "methods": _summary(examples, METHODS),
            "jump_forward": _jump_forward(
                model, tokenizer, [PE_PROMPT.format(options=options, text=e.text) for e in examples], automaton, longest
            ),
            "examples": [_example_record(example) for example in examples],
        }

    table16: dict[str, Any] = {}
    for k in settings.tool_k:
        names, namespaces, actions, resources = datasets.tool_catalogue(k)
        automaton = compiler.compile(names)
        longest = max(len(name.encode()) for name in names)
        prompt_prefix = TOOL_PROMPT.format(
            namespaces=", ".join(namespaces), actions=", ".join(actions), resources=", ".join(resources), text="\0"
        )
        generator = SharedPrefixGenerator(model, tokenizer, render(prompt_prefix).split("\0")[0])
        rng = random.Random(settings.seed + k)
        examples = [Example(text=tool_request(name), label=name) for name in rng.sample(names, settings.per_k)]
        for index in steps(f"tools (K={k:,})", len(examples)):
            example = examples[index]
            prompt = render(prompt_prefix.replace("\0", example.text))
            example.outcomes["unconstrained"] = _unconstrained(generator, prompt, names, settings.answer_tokens)
            example.outcomes["trie"], used = _constrained(generator, prompt, automaton, longest)
            mask_steps, mask_seconds = mask_steps + used[0], mask_seconds + used[1]
        table16[str(k)] = {
            "K": k,
            "sample": len(examples),
            "methods": _summary(examples, TOOL_METHODS),
            "jump_forward": _jump_forward(
                model, tokenizer, [prompt_prefix.replace("\0", e.text) for e in examples], automaton, longest
            ),
            "examples": [_example_record(example) for example in examples],
        }

    return {
        "model": os.path.basename(str(getattr(model.config, "_name_or_path", "")).rstrip("/")) or type(model).__name__,
        "settings": {**asdict(settings), "datasets": list(settings.datasets), "tool_k": list(settings.tool_k)},
        "seconds": time.perf_counter() - started,
        "mask_steps": mask_steps,
        "mean_mask_microseconds": mask_seconds / mask_steps * 1e6 if mask_steps else None,
        "machine": f"{os.cpu_count()} CPUs, torch {torch.__version__}, {torch.get_num_threads()} threads",
        "table6": table6,
        "table16": table16,
    }


def _jump_forward(model: Any, tokenizer: Any, prompts: list[str], automaton: Any, longest: int) -> dict[str, Any]:
    """The constrained answers decoded in triemask's own loop without and with jump-forward
    (verified drafts): forward passes per answer, seconds in all, answers the same."""
    from ..integrations.transformers import generate_constrained

    runs = {
        mode: generate_constrained(model, tokenizer, prompts, automaton, jump_forward=mode, max_new_tokens=longest + 1)
        for mode in (False, True)
    }
    return {
        "answers": len(prompts),
        "passes_plain": statistics.mean(d.forward_passes for d in runs[False]),
        "passes_jump": statistics.mean(d.forward_passes for d in runs[True]),
        "seconds_plain": sum(d.seconds for d in runs[False]),
        "seconds_jump": sum(d.seconds for d in runs[True]),
        "same_answers": sum(p.tokens == j.tokens for p, j in zip(runs[False], runs[True], strict=True)),
    }


def _unconstrained(generator: Any, prompt: str, labels: Sequence[str], max_new_tokens: int) -> Outcome:
    t0 = time.perf_counter()
    output = generator.generate(prompt, automaton=None, max_new_tokens=max_new_tokens, first_line=True).text
    prediction, valid = match_label(output, labels)
    return Outcome(output=output, prediction=prediction, valid=valid, seconds=time.perf_counter() - t0)


def _constrained(generator: Any, prompt: str, automaton: Any, longest: int) -> tuple[Outcome, tuple[int, float]]:
    from ..integrations.transformers import spelled_value

    t0 = time.perf_counter()
    generation = generator.generate(prompt, automaton=automaton, max_new_tokens=longest + 1)  # a token >= 1 byte
    seconds = time.perf_counter() - t0
    value = spelled_value(automaton, generation.tokens)
    outcome = Outcome(output=generation.text, prediction=value, valid=value is not None, seconds=seconds)
    return outcome, (generation.mask_steps, generation.mask_seconds)


def _summary(examples: Sequence[Example], methods: Sequence[str]) -> dict[str, dict[str, float]]:
    summary = {}
    for method in methods:
        outcomes = [example.outcomes[method] for example in examples]
        summary[method] = {
            "accuracy": 100
            * sum(o.prediction == e.label for o, e in zip(outcomes, examples, strict=True))
            / len(examples),
            "validity": 100 * sum(o.valid for o in outcomes) / len(examples),
            "mean_seconds": statistics.fmean(o.seconds for o in outcomes),
        }
    return summary


def _example_record(example: Example) -> dict[str, Any]:
    record: dict[str, Any] = {"text": example.text, "label": example.label}
    if example.thinking is not None:
        record["thinking"] = example.thinking
    record["outcomes"] = {method: asdict(outcome) for method, outcome in example.outcomes.items()}
    return record


# --------------------------------------------------------------------------- reports


def to_markdown(results: dict[str, Any]) -> str:
    """Tables 6 and 16 as Markdown (accuracy / validity in %, sample sizes stated)."""
    settings = results["settings"]
    lines = [
        f"Model: {results['model']}; greedy; {results['machine']}; {results['seconds'] / 60:.1f} min in all; "
        f"set constraint {results['mean_mask_microseconds']:.0f} us per step (mean over {results['mask_steps']:,} "
        "steps: row states and masking the logits).",
        "",
        "### Table 6: accuracy / validity (%)",
        "",
        f"Stratified sample of {settings['per_dataset'] or 'all'} test rows per dataset (seed {settings['seed']}); "
        f"think phase up to {settings['think_tokens']} tokens.",
        "",
        "| dataset | K | sample | " + " | ".join(METHODS) + " |",
        "|---|---|---|" + "---|" * len(METHODS),
    ]
    for name, table in results["table6"].items():
        cells = [f"{m['accuracy']:.1f} / {m['validity']:.0f}" for m in (table["methods"][x] for x in METHODS)]
        lines.append(
            f"| {name} | {table['K']} | {table['sample']} of {table['test_rows']:,} | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        "Mean seconds per example: "
        + "; ".join(
            f"{name} " + ", ".join(f"{m} {t['methods'][m]['mean_seconds']:.1f}" for m in METHODS)
            for name, t in results["table6"].items()
        )
        + " (the think methods include the shared reasoning phase).",
        "",
        "### Table 16: validity (accuracy) vs K, synthetic tool selection (%)",
        "",
        f"{settings['per_k']} requests per K; the prompt describes the registry (namespaces, actions, resources).",
        "",
        "| K | sample | unconstrained validity | trie validity | unconstrained accuracy | trie accuracy |",
        "|---|---|---|---|---|---|",
    ]
    for table in results["table16"].values():
        u, t = table["methods"]["unconstrained"], table["methods"]["trie"]
        lines.append(
            f"| {table['K']:,} | {table['sample']} | {u['validity']:.0f} | {t['validity']:.0f} | "
            f"{u['accuracy']:.0f} | {t['accuracy']:.0f} |"
        )
    lines += [
        "",
        "### Jump-forward: the constrained answers (PE + trie, trie) in triemask's decoding loop",
        "",
        "Forward passes per answer and seconds in all (the prompts' shared start read once, not counted), "
        "without / with jump-forward (verified drafts); answers the same token for token.",
        "",
        "| set | K | answers | passes per answer | ratio | seconds | ratio | same answers |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, table in [*results["table6"].items(), *((f"tools {k}", t) for k, t in results["table16"].items())]:
        jump = table["jump_forward"]
        lines.append(
            f"| {name} | {table['K']:,} | {jump['answers']} | {jump['passes_plain']:.1f} / {jump['passes_jump']:.1f} | "
            f"{jump['passes_plain'] / jump['passes_jump']:.2f}x | {jump['seconds_plain']:.1f} / "
            f"{jump['seconds_jump']:.1f} | {jump['seconds_plain'] / jump['seconds_jump']:.2f}x | "
            f"{jump['same_answers']} of {jump['answers']} |"
        )
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: str) -> None:
    """Accuracy and validity per dataset and method as grouped bars (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["table6"])
    figure, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    width = 0.8 / len(METHODS)
    for axis, measure in zip(axes, ("accuracy", "validity"), strict=True):
        for offset, method in enumerate(METHODS):
            heights = [results["table6"][name]["methods"][method][measure] for name in names]
            positions = [i + (offset - (len(METHODS) - 1) / 2) * width for i in range(len(names))]
            axis.bar(positions, heights, width, label=method)
        axis.set_xticks(range(len(names)), [f"{n}\nK={results['table6'][n]['K']}" for n in names])
        axis.set_title(f"{measure} (%)")
        axis.set_ylim(0, 105)
    axes[0].legend(fontsize=8)
    figure.suptitle(f"{results['model']}: unconstrained vs trie-constrained answers")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
