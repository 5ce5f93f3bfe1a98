"""What the serving limits bound, and what a device mask costs, on this machine.

    python -m benchmarks.serving_limits [--out benchmarks/results]

1. Stall bound: the engine step that admits a request with a new set compiles it, so the
   longest stall a request can cause is the compile of the largest admissible set. Sets
   at the default limits (``Limits()``: 100,000 values, 1,024 bytes per value, 1 MiB per
   set) of three shapes, compiled against Qwen2.5's 151,936-token vocabulary; median of 3.
2. Device masks (``DeviceAutomaton.mask_logits``, CPU torch) for B = 64 rows of 151,936
   logits, from host states and from device states, against the CPU bitmask path
   (``TrieAutomaton.fill_bitmask``): 150,000 single-token values (the root allows 150,000
   tokens) with the rows at the root and one token in, and K = 1,000 synthetic tools.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import string
import time
from pathlib import Path
from typing import Any

import numpy as np

from triemask import Compiler, allocate_token_bitmask
from triemask.datasets import synthetic_tools
from triemask.integrations.serving import Limits

from .vocabs import load


def _median_seconds(repeats: int, run: Any, *args: Any) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run(*args)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _at_the_limits(limits: Limits) -> dict[str, list[str]]:
    rng = random.Random(0)
    alphabet = string.ascii_letters + string.digits + "._-/ "

    def random_values(count: int, length: int) -> list[str]:
        return ["".join(rng.choices(alphabet, k=length)) for _ in range(count)]

    budget = limits.max_set_bytes
    return {
        f"{limits.max_values:,} values of {budget // limits.max_values} random bytes": random_values(
            limits.max_values, budget // limits.max_values
        ),
        f"{budget // 20:,} values of 20 random bytes": random_values(budget // 20, 20),
        f"{budget // limits.max_value_bytes:,} values of {limits.max_value_bytes:,} random bytes": random_values(
            budget // limits.max_value_bytes, limits.max_value_bytes
        ),
    }


def stall_bound(compiler: Compiler, repeats: int) -> list[dict[str, Any]]:
    rows = []
    for shape, values in _at_the_limits(Limits()).items():
        assert sum(len(v.encode()) for v in values) <= Limits().max_set_bytes
        seconds = _median_seconds(repeats, compiler.compile, values)
        rows.append({"set": shape, "values": len(values), "compile_ms": round(seconds * 1000, 1)})
    return rows


def device_masks(compiler: Compiler, repeats: int) -> list[dict[str, Any]]:
    import torch

    from triemask.integrations.torch import DeviceAutomaton

    vocab = compiler.vocab
    singles = sorted({vocab.token_bytes(int(t)) or b"" for t in vocab.text_token_ids()[:150_000]} - {b""})
    cases = {
        "150,000 single-token values": compiler.compile(singles),
        "1,000 tools": compiler.compile(synthetic_tools(1000)),
    }
    rng = np.random.default_rng(0)
    rows = []
    for name, automaton in cases.items():
        on_device = DeviceAutomaton(automaton)
        root = automaton.allowed_token_ids(0)
        one_in = np.array([automaton.next_state(0, int(t)) for t in rng.choice(root, 64)], dtype=np.int64)
        for where, states in (("root", np.zeros(64, dtype=np.int64)), ("one token in", one_in)):
            logits = torch.zeros(64, vocab.vocab_size)
            bitmask = allocate_token_bitmask(64, vocab.vocab_size)
            device_states = torch.from_numpy(states)
            pairs = int(sum(len(automaton.allowed_token_ids(int(s))) for s in states))
            rows.append(
                {
                    "set": name,
                    "rows at": where,
                    "allowed pairs": pairs,
                    "mask_logits host states ms": round(
                        _median_seconds(repeats, on_device.mask_logits, logits, states) * 1000, 2
                    ),
                    "mask_logits device states ms": round(
                        _median_seconds(repeats, on_device.mask_logits, logits, device_states) * 1000, 2
                    ),
                    "fill_bitmask ms": round(
                        _median_seconds(repeats, automaton.fill_bitmask, bitmask, states) * 1000, 2
                    ),
                }
            )
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += [
        "| " + " | ".join(f"{row[key]:,}" if isinstance(row[key], int) else str(row[key]) for key in head) + " |"
        for row in rows
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write serving-limits.{json,md} here")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    compiler = Compiler(load("qwen2.5").vocab)
    results = {
        "stall_bound": stall_bound(compiler, args.repeats),
        "device_masks": device_masks(compiler, args.repeats * 3),
    }
    text = "\n\n".join(
        [
            f"Limits: {Limits()}",
            "Compile of a set at the limits (the longest stall one request can cause):\n\n"
            + _table(results["stall_bound"]),
            "Masks for B = 64 rows of 151,936 logits:\n\n" + _table(results["device_masks"]),
        ]
    )
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "serving-limits.json").write_text(json.dumps(results, indent=2) + "\n")
        (args.out / "serving-limits.md").write_text(f"# `python -m benchmarks.serving_limits`\n\n{text}\n")


if __name__ == "__main__":
    main()
