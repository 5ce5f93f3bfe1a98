"""Random walks over real-shaped schemas on a real vocabulary, every token judged by the
language (``test_schemas.compare_walks``), with what was checked counted (issue 23's figures):

    .venv/bin/python tests/walk_report.py --vocab qwen2 --walks 20 --steps 80

A disagreement fails with the output, the token and its bytes; the counts are printed per schema.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from conftest import real_compiler, real_vocabulary
from test_schema_strictness import REAL_SCHEMAS
from test_schemas import compare_walks, reference_compiler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", default="qwen2")
    parser.add_argument("--walks", type=int, default=20)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--any-whitespace", action="store_true")
    options = parser.parse_args()
    compiler, vocab = real_compiler(options.vocab), real_vocabulary(options.vocab).vocab
    total: Counter[str] = Counter()
    for name, schema in REAL_SCHEMAS.items():
        tally: Counter[str] = Counter()
        compiled = compiler.compile_json_schema(schema, any_whitespace=options.any_whitespace)
        reference = reference_compiler(vocab).compile_json_schema(
            json.dumps(schema), any_whitespace=options.any_whitespace
        )
        compare_walks(compiled, reference, vocab, walks=options.walks, steps=options.steps, seed=1, tally=tally)
        print(f"{name}: trie fields {len(compiled.stats()['trie_fields'])}, {dict(tally)}", flush=True)
        total += tally
    print(f"all ({options.vocab}, any_whitespace={options.any_whitespace}): {dict(total)}")
    print("disagreements with the language: 0")


if __name__ == "__main__":
    main()
