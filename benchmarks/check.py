"""The regression gate: a fresh quick run's same-run ratios against the committed ones.

    python -m benchmarks.check [--baseline benchmarks/results/quick.json] [--factor 2] [--results FILE]
        [--schemas-baseline benchmarks/results/schemas-peers.json] [--schemas-results FILE]

Runs ``python -m benchmarks --quick``, ``python -m benchmarks schemas --peers`` and
``python -m benchmarks formats --quick`` (or reads ``--results``, ``--schemas-results`` and
``--formats-results``), takes every ratio of the issue targets (triemask against xgrammar and
llguidance: compile, per step, batch fill; for ordinary JSON schemas against xgrammar: compile,
per step, batch of 64; for the formats and finite patterns on Qwen2.5, the faster peer's first
mask against triemask's, eager and lazy) from the runs, and fails when a fresh ratio is below
the committed one divided by ``--factor``. Ratios are measured in one process on one
vocabulary, so machine speed cancels out; what remains is run-to-run noise, which on the 2-core VM these results come
from moves a same-code ratio by up to 1.4x (per step at K = 10,000: 163x vs 193x; batch
fill: 200x vs 281x). A factor of 2 leaves that margin and still catches the loss of the
C kernel (per step vs xgrammar 3.6x -> 1.1x, batch fill 4.5x -> 1.9x at K = 1,000).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import formats, report, schemas


def ratios(results: dict[str, Any]) -> dict[str, float]:
    return {name: ratio for name, _, ratio, _, _ in report.targets(results) if ratio is not None}


def fresh_run(arguments: list[str], name: str, given: Path | None) -> dict[str, Any]:
    """The results of ``python -m benchmarks <arguments>`` (its ``name``), or of ``given``."""
    if given is not None:
        loaded: dict[str, Any] = json.loads(given.read_text())
        return loaded
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run([sys.executable, "-m", "benchmarks", *arguments, "--out", folder], check=True)
        found: dict[str, Any] = json.loads((Path(folder) / name).read_text())
        return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.check", description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, default=Path("benchmarks/results/quick.json"))
    parser.add_argument("--results", type=Path, help="a quick run's JSON (default: run one now)")
    parser.add_argument("--schemas-baseline", type=Path, default=Path("benchmarks/results/schemas-peers.json"))
    parser.add_argument("--schemas-results", type=Path, help="a schemas --peers run's JSON (default: run one now)")
    parser.add_argument("--formats-baseline", type=Path, default=Path("benchmarks/results/formats.json"))
    parser.add_argument("--formats-results", type=Path, help="a formats --quick run's JSON (default: run one now)")
    parser.add_argument("--factor", type=float, default=2.0)
    options = parser.parse_args(argv)
    baseline = ratios(json.loads(options.baseline.read_text()))
    baseline |= schemas.peer_ratios(json.loads(options.schemas_baseline.read_text()))
    baseline |= formats.peer_ratios(json.loads(options.formats_baseline.read_text()))
    fresh = ratios(fresh_run(["--quick"], "quick.json", options.results))
    fresh |= schemas.peer_ratios(fresh_run(["schemas", "--peers"], "schemas-peers.json", options.schemas_results))
    fresh |= formats.peer_ratios(fresh_run(["formats", "--quick"], "formats-quick.json", options.formats_results))
    failed = []
    print(f"{'ratio (peer / triemask, same run)':50s} {'committed':>10s} {'now':>10s}  floor (/{options.factor:g})")
    for name, committed in baseline.items():
        now = fresh.get(name)
        floor = committed / options.factor
        verdict = "missing" if now is None else "ok" if now >= floor else "REGRESSED"
        print(f"{name:50s} {committed:10.3g} {'-' if now is None else f'{now:.3g}':>10s}  {floor:.3g} {verdict}")
        if verdict != "ok":
            failed.append(name)
    if failed:
        print(f"bench-check failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print("bench-check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
