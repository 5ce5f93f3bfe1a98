"""Small GGUF and SentencePiece model files written byte by byte, for the reader tests and
the fuzz targets (no dependency: the layouts are those of the GGUF v3 and protobuf specs)."""

from __future__ import annotations

import struct
from typing import Any

STRING, ARRAY, UINT32, INT32 = 8, 9, 4, 5


def _string(value: bytes) -> bytes:
    return struct.pack("<Q", len(value)) + value


def gguf_bytes(fields: list[tuple[str, int, Any]], *, version: int = 3) -> bytes:
    """A GGUF file with no tensors and the given ``(key, type, value)`` metadata; an
    array value is ``(item_type, items)``."""
    out = [b"GGUF", struct.pack("<IQQ", version, 0, len(fields))]
    for key, kind, value in fields:
        out.append(_string(key.encode()) + struct.pack("<I", kind))
        if kind == STRING:
            out.append(_string(value))
        elif kind == ARRAY:
            item_kind, items = value
            out.append(struct.pack("<IQ", item_kind, len(items)))
            out.extend(_string(item) if item_kind == STRING else struct.pack("<i", item) for item in items)
        else:
            out.append(struct.pack("<I" if kind == UINT32 else "<i", value))
    return b"".join(out)


def tokenizer_gguf(model: bytes = b"gpt2", tokens: list[bytes] | None = None) -> bytes:
    """A valid GGUF tokenizer: byte-level BPE tokens, types, an EOS id."""
    tokens = tokens or [b"h", b"e", b"l", b"o", b"\xc4\xa0", b"hello", b"<eos>"]
    types = [1] * (len(tokens) - 1) + [3]
    return gguf_bytes(
        [
            ("general.architecture", STRING, b"llama"),
            ("tokenizer.ggml.model", STRING, model),
            ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
            ("tokenizer.ggml.token_type", ARRAY, (INT32, types)),
            ("tokenizer.ggml.eos_token_id", UINT32, len(tokens) - 1),
        ]
    )


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def sentencepiece_bytes(pieces: list[tuple[str, int]], eos_id: int = 2) -> bytes:
    """A serialized ``ModelProto`` with the given (piece, type) pairs and trainer eos_id."""
    out = [_field(1, _field(1, piece.encode()) + _varint(3 << 3) + _varint(kind)) for piece, kind in pieces]
    out.append(_field(2, _varint(42 << 3) + _varint(eos_id)))
    return b"".join(out)


SMALL_SENTENCEPIECE = [("<unk>", 2), ("<s>", 3), ("</s>", 3), ("<0x0A>", 6), ("\u2581hi", 1), ("x", 1)]
