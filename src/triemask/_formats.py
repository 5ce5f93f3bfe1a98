"""Readers for the token-table formats triemask understands, with no dependencies.

* the GPT-2 byte-level alphabet (``Ġ`` for space) used by byte-level BPE tokenizers;
* SentencePiece pieces (``▁`` for space, ``<0xNN>`` byte fallback) and the
  SentencePiece ``ModelProto`` file format (a few protobuf fields);
* the GGUF container, of which only the ``tokenizer.*`` metadata is read.
"""

from __future__ import annotations

import re
import struct
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ._errors import VocabularyError

SPIECE_SPACE = "\u2581"  # "▁", SentencePiece's stand-in for a space
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>\Z")

# SentencePiece / GGUF token types (identical numbering in both formats).
TYPE_NORMAL = 1
TYPE_UNKNOWN = 2
TYPE_CONTROL = 3
TYPE_USER_DEFINED = 4
TYPE_UNUSED = 5
TYPE_BYTE = 6


@lru_cache(maxsize=1)
def byte_level_decoder() -> dict[str, int]:
    """Map each character of the GPT-2 byte-level alphabet to the byte it stands for."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars = list(printable)
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def decode_byte_level(token: str) -> bytes:
    """Decode one byte-level BPE token string (``"Ġhello"`` -> ``b" hello"``).

    A token with a character outside the byte-level alphabet is taken as raw UTF-8
    text, as the Hugging Face ``ByteLevel`` decoder does (some vocabularies hold a
    few such tokens, e.g. ``"\u200d"`` in Command-R's).
    """
    table = byte_level_decoder()
    try:
        return bytes(table[ch] for ch in token)
    except KeyError:
        return token.encode("utf-8")


def decode_sentencepiece_piece(piece: str, *, byte_fallback: bool = True) -> bytes:
    """Decode one SentencePiece piece: ``▁`` is a space, ``<0xNN>`` is byte NN."""
    if byte_fallback:
        match = _BYTE_PIECE.match(piece)
        if match:
            return bytes([int(match.group(1), 16)])
    return piece.replace(SPIECE_SPACE, " ").encode("utf-8")


# --------------------------------------------------------------------------- protobuf


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise VocabularyError("truncated SentencePiece model: a varint runs past the end")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _protobuf_fields(data: bytes) -> list[tuple[int, int, Any]]:
    """Split one protobuf message into (field number, wire type, raw value) triples."""
    fields: list[tuple[int, int, Any]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            value, pos = data[pos : pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos : pos + size], pos + size
        elif wire == 5:
            value, pos = data[pos : pos + 4], pos + 4
        else:
            raise VocabularyError(f"not a SentencePiece model: protobuf wire type {wire}")
        fields.append((number, wire, value))
    return fields


def _int32(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def read_sentencepiece_model(data: bytes) -> tuple[list[tuple[str, int]], int]:
    """Parse a serialized SentencePiece ``ModelProto``.

    Returns
    -------
    pieces : list of (piece, type)
        One entry per token id.
    eos_id : int
        ``trainer_spec.eos_id`` (-1 when the model has none).
    """
    pieces: list[tuple[str, int]] = []
    eos_id = 2  # the protobuf default of TrainerSpec.eos_id
    for number, wire, value in _protobuf_fields(data):
        if number == 1 and wire == 2:  # repeated SentencePiece pieces
            piece, kind = "", TYPE_NORMAL
            for sub_number, sub_wire, sub_value in _protobuf_fields(value):
                if sub_number == 1 and sub_wire == 2:
                    piece = sub_value.decode("utf-8")
                elif sub_number == 3 and sub_wire == 0:
                    kind = sub_value
            pieces.append((piece, kind))
        elif number == 2 and wire == 2:  # TrainerSpec
            for sub_number, sub_wire, sub_value in _protobuf_fields(value):
                if sub_number == 42 and sub_wire == 0:
                    eos_id = _int32(sub_value)
    if not pieces:
        raise VocabularyError("not a SentencePiece model: it has no pieces")
    return pieces, eos_id


# --------------------------------------------------------------------------- GGUF

_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def read_gguf_tokenizer(path: str | Path) -> dict[str, Any]:
    """Read the ``tokenizer.*`` metadata of a GGUF file (tensors are never read).

    String arrays come back as ``list[bytes]``, numeric arrays as numpy arrays.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise VocabularyError(f"cannot read GGUF file {str(path)!r}: {exc}") from exc
    if data[:4] != b"GGUF":
        raise VocabularyError(f"{str(path)!r} is not a GGUF file (magic {data[:4]!r})")
    version, _n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    if version < 2:
        raise VocabularyError(f"{str(path)!r}: GGUF version {version} is not supported (need >= 2)")
    pos = 24
    unpack = struct.unpack_from

    def read_string(pos: int) -> tuple[bytes, int]:
        (size,) = unpack("<Q", data, pos)
        return data[pos + 8 : pos + 8 + size], pos + 8 + size

    def read_value(kind: int, pos: int) -> tuple[Any, int]:
        if kind == _GGUF_STRING:
            return read_string(pos)
        if kind == _GGUF_ARRAY:
            item_kind, count = unpack("<IQ", data, pos)
            pos += 12
            if item_kind == _GGUF_STRING:
                items = []
                for _ in range(count):
                    item, pos = read_string(pos)
                    items.append(item)
                return items, pos
            if item_kind not in _GGUF_SCALARS:
                raise VocabularyError(f"{str(path)!r}: unsupported GGUF array item type {item_kind}")
            dtype = np.dtype("<" + _GGUF_SCALARS[item_kind])
            array = np.frombuffer(data, dtype=dtype, count=count, offset=pos)
            return array, pos + count * dtype.itemsize
        if kind not in _GGUF_SCALARS:
            raise VocabularyError(f"{str(path)!r}: unsupported GGUF value type {kind}")
        fmt = "<" + _GGUF_SCALARS[kind]
        return unpack(fmt, data, pos)[0], pos + struct.calcsize(fmt)

    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        raw_key, pos = read_string(pos)
        (kind,) = unpack("<I", data, pos)
        value, pos = read_value(kind, pos + 4)
        key = raw_key.decode("utf-8", "replace")
        if key.startswith("tokenizer.ggml."):
            metadata[key] = value
    return metadata
