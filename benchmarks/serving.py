"""Serving throughput in vLLM (paper, Table 3 analogue): triemask's logits processor vs
vLLM's own ``choice`` structured output (an xgrammar alternation) vs unconstrained.

One ``LLM`` (SmolLM2-135M-Instruct, the default model's converted weights, on this CPU)
serves every mode, so the ratios are same-run. For each batch size B the modes take turns,
B requests per ``generate`` call, and the median of the repeats is kept. Run it in the
vLLM environment (``make bench-serving``)::

    .venv-vllm/bin/python -m benchmarks.serving --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from triemask.datasets import synthetic_tools

BATCHES = (1, 8, 32, 64, 128)
MODES = ("unconstrained", "triemask", "vLLM choice")


def _model_folder(which: str) -> Path:
    """SmolLM2-135M-Instruct (``smollm2``), or a tiny random model with its tokenizer
    (``tiny``: two layers, so the forward pass costs little and the constraint shows)."""
    root = Path(os.environ.get("TRIEMASK_CACHE") or Path.home() / ".cache" / "triemask")
    folder = root / "SmolLM2-135M-Instruct"
    if not (folder / "config.json").exists():
        raise SystemExit(
            f"{folder} is missing: convert the default model first (make demo, or "
            "python -c 'import triemask; triemask.load_default_model()' in the main environment)"
        )
    if which == "smollm2":
        return folder
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tiny = root / "tiny-random-smollm2"
    if not (tiny / "config.json").exists():
        config = AutoConfig.from_pretrained(folder)
        config.num_hidden_layers, config.hidden_size, config.intermediate_size = 2, 128, 256
        config.num_attention_heads, config.num_key_value_heads, config.head_dim = 2, 1, 64
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config).save_pretrained(tiny)
        AutoTokenizer.from_pretrained(folder).save_pretrained(tiny)
    return tiny


def _requests(k: int, count: int) -> tuple[list[str], list[str]]:
    tools = synthetic_tools(k, seed=0)
    asks = [f"Which tool should handle this request: {tool.replace('.', ' ').replace('_', ' ')}?" for tool in tools]
    return tools, [asks[i % len(asks)] for i in range(count)]


def run(batches: tuple[int, ...], k: int, repeats: int, max_tokens: int, model: str) -> dict[str, Any]:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from triemask.integrations.vllm import TriemaskLogitsProcessor

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    folder = _model_folder(model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tools, asks = _requests(k, max(batches))
    prompts = [
        tokenizer.apply_chat_template(
            [
                {"role": "system", "content": "Reply with a single tool name."},
                {"role": "user", "content": ask},
            ],
            add_generation_prompt=True,
            tokenize=False,
        )
        for ask in asks
    ]
    started = time.perf_counter()
    llm = LLM(
        model=str(folder),
        dtype="float32",
        max_model_len=512,
        max_num_seqs=max(batches),
        logits_processors=[TriemaskLogitsProcessor],
        seed=0,
    )
    startup = time.perf_counter() - started
    params = {
        "unconstrained": SamplingParams(temperature=0.0, max_tokens=max_tokens),
        "triemask": SamplingParams(temperature=0.0, max_tokens=max_tokens, extra_args={"triemask_values": tools}),
        "vLLM choice": SamplingParams(
            temperature=0.0, max_tokens=max_tokens, structured_outputs=StructuredOutputsParams(choice=tools)
        ),
    }
    members = set(tools)
    first: dict[str, float] = {}
    for mode in MODES:  # the first request of a set pays its compilation
        t0 = time.perf_counter()
        llm.generate(prompts[:1], params[mode], use_tqdm=False)
        first[mode] = time.perf_counter() - t0
    rows = []
    for batch in batches:
        seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
        tokens: dict[str, float] = {}
        valid: dict[str, float] = {}
        for _ in range(repeats):
            for mode in MODES:  # interleaved, so drift hits all modes alike
                t0 = time.perf_counter()
                outputs = llm.generate(prompts[:batch], params[mode], use_tqdm=False)
                seconds[mode].append(time.perf_counter() - t0)
                texts = [output.outputs[0].text for output in outputs]
                tokens[mode] = statistics.fmean(len(output.outputs[0].token_ids) for output in outputs)
                valid[mode] = 100 * sum(text in members for text in texts) / batch
        medians = {mode: statistics.median(values) for mode, values in seconds.items()}
        rows.append(
            {
                "batch": batch,
                "seconds": medians,
                "requests_per_second": {mode: batch / medians[mode] for mode in MODES},
                "tokens_per_request": tokens,
                "valid_percent": valid,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    import vllm

    return {
        "k": k,
        "repeats": repeats,
        "max_tokens": max_tokens,
        "model": folder.name,
        "vllm": vllm.__version__,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "startup_seconds": startup,
        "first_request_seconds": first,
        "rows": rows,
    }


def to_markdown(results: dict[str, Any]) -> str:
    lines = [
        f"vLLM {results['vllm']} (V1 runner, CPU), {results['model']}, K = {results['k']:,} synthetic tools, "
        f"greedy, max_tokens {results['max_tokens']}, median of {results['repeats']} interleaved repeats; "
        f"{results['machine']}.",
        "",
        "| B | unconstrained req/s | triemask req/s | vLLM choice req/s | triemask / choice | "
        "tokens per request (unconstrained / triemask / choice) | valid % (unconstrained / triemask / choice) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        rps, tokens, valid = row["requests_per_second"], row["tokens_per_request"], row["valid_percent"]
        lines.append(
            f"| {row['batch']} | {rps['unconstrained']:.2f} | {rps['triemask']:.2f} | {rps['vLLM choice']:.2f} | "
            f"{rps['triemask'] / rps['vLLM choice']:.2f}x | "
            + " / ".join(f"{tokens[m]:.1f}" for m in MODES)
            + " | "
            + " / ".join(f"{valid[m]:.0f}" for m in MODES)
            + " |"
        )
    first = results["first_request_seconds"]
    lines += [
        "",
        "First request of each mode (one request; includes compiling the set): "
        + ", ".join(f"{mode} {first[mode]:.2f} s" for mode in MODES)
        + f". Engine start-up {results['startup_seconds']:.0f} s.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="folder for serving.json and serving.md")
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--k", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    args = parser.parse_args()
    results = run(tuple(args.batches), args.k, args.repeats, args.max_tokens, args.model)
    report = to_markdown(results)
    print(report)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        name = "serving" if args.model == "smollm2" else f"serving-{args.model}"
        (out / f"{name}.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
        (out / f"{name}.md").write_text(report, encoding="utf-8")


if __name__ == "__main__":
    main()
