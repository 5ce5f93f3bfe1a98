"""Coverage-guided fuzzing of the tokenizer-file readers with atheris, run by hand:

    pip install atheris
    python tests/fuzz_readers.py gguf -max_total_time=600        # or: sentencepiece, tokenizer_json
    python tests/fuzz_readers.py gguf path/to/crash-...          # replay one input

Each input must be read or refused with a VocabularyError; anything else (another
exception, a hang, a large allocation: run with -rss_limit_mb=512) is a finding. The
hypothesis tests in test_file_readers.py run the same targets, briefly, in `make test`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))

from gguf_files import SMALL_SENTENCEPIECE, sentencepiece_bytes, tokenizer_gguf
from triemask import Vocabulary, VocabularyError

_FOLDER = tempfile.mkdtemp(prefix="triemask-fuzz-")


def gguf(data: bytes) -> None:
    path = os.path.join(_FOLDER, "input.gguf")
    with open(path, "wb") as file:
        file.write(data)
    Vocabulary.from_gguf(path)


def sentencepiece(data: bytes) -> None:
    Vocabulary.from_sentencepiece(data)


def tokenizer_json(data: bytes) -> None:
    import tokenizers

    try:
        tokenizer = tokenizers.Tokenizer.from_str(data.decode("utf-8", "replace"))
    except Exception:
        return
    Vocabulary.from_huggingface(tokenizer)


TARGETS = {"gguf": gguf, "sentencepiece": sentencepiece, "tokenizer_json": tokenizer_json}
SEEDS = {
    "gguf": tokenizer_gguf(),
    "sentencepiece": sentencepiece_bytes(SMALL_SENTENCEPIECE),
    "tokenizer_json": b'{"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}',
}


def main() -> None:
    import atheris

    name = sys.argv.pop(1) if len(sys.argv) > 1 and sys.argv[1] in TARGETS else "gguf"
    target = TARGETS[name]

    def one_input(data: bytes) -> None:
        with contextlib.suppress(VocabularyError):
            target(data)

    corpus = os.path.join(_FOLDER, "corpus")
    os.makedirs(corpus, exist_ok=True)
    with open(os.path.join(corpus, "seed"), "wb") as file:
        file.write(SEEDS[name])
    atheris.instrument_all()  # coverage feedback from triemask's (already imported) Python code
    atheris.Setup([*sys.argv, corpus], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
