"""Readers for the token-table formats triemask understands, with no dependencies.

* the GPT-2 byte-level alphabet (``Ġ`` for space) used by byte-level BPE tokenizers;
* SentencePiece pieces (``▁`` for space, ``<0xNN>`` byte fallback) and the
  SentencePiece ``ModelProto`` file format (a few protobuf fields);
* the GGUF container, of which only the ``tokenizer.*`` metadata is read.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ..base import ArgumentTypeError, VocabularyError

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

_MAX_VARINT_BYTES = 10  # a 64-bit varint never takes more: a longer run is malformed, not a big number


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    stop = min(end, pos + _MAX_VARINT_BYTES)
    while pos < stop:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
    if pos >= end:
        raise VocabularyError(f"malformed SentencePiece model: a varint at offset {pos} runs past the end")
    raise VocabularyError(f"malformed SentencePiece model: a varint at offset {pos} is longer than 10 bytes")


def _protobuf_fields(data: bytes, start: int, end: int) -> list[tuple[int, int, Any, int]]:
    """Split the protobuf message ``data[start:end]`` into (field number, wire type, value,
    offset) tuples; a length-delimited value is its ``(start, end)`` span inside ``data``."""
    fields: list[tuple[int, int, Any, int]] = []
    pos = start
    while pos < end:
        offset = pos
        key, pos = _varint(data, pos, end)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(data, pos, end)
        elif wire in (1, 2, 5):
            if wire == 2:
                size, pos = _varint(data, pos, end)
            else:
                size = 8 if wire == 1 else 4
            if size > end - pos:
                raise VocabularyError(
                    f"malformed SentencePiece model: field {number} at offset {offset} holds {size} bytes "
                    f"but only {end - pos} remain"
                )
            value, pos = (pos, pos + size), pos + size
        else:
            raise VocabularyError(f"not a SentencePiece model: protobuf wire type {wire} at offset {offset}")
        fields.append((number, wire, value, offset))
    return fields


def _int32(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def read_sentencepiece_model(data: bytes) -> tuple[list[tuple[str, int]], int]:
    """Parse a serialized SentencePiece ``ModelProto`` (linear in its size; every
    malformed input raises :class:`VocabularyError` naming the offset).

    Returns
    -------
    pieces : list of (piece, type)
        One entry per token id.
    eos_id : int
        ``trainer_spec.eos_id`` (-1 when the model has none).
    """
    pieces: list[tuple[str, int]] = []
    eos_id = 2  # the protobuf default of TrainerSpec.eos_id
    for number, wire, value, _ in _protobuf_fields(data, 0, len(data)):
        if number == 1 and wire == 2:  # repeated SentencePiece pieces
            piece, kind = "", TYPE_NORMAL
            for sub_number, sub_wire, sub_value, sub_offset in _protobuf_fields(data, *value):
                if sub_number == 1 and sub_wire == 2:
                    try:
                        piece = data[sub_value[0] : sub_value[1]].decode("utf-8")
                    except UnicodeDecodeError:
                        raise VocabularyError(
                            f"malformed SentencePiece model: piece #{len(pieces)} at offset {sub_offset} "
                            "is not valid UTF-8"
                        ) from None
                elif sub_number == 3 and sub_wire == 0:
                    kind = sub_value
            pieces.append((piece, kind))
        elif number == 2 and wire == 2:  # TrainerSpec
            for sub_number, sub_wire, sub_value, _ in _protobuf_fields(data, *value):
                if sub_number == 42 and sub_wire == 0:
                    eos_id = _int32(sub_value)
    if not pieces:
        raise VocabularyError("not a SentencePiece model: it has no pieces")
    return pieces, eos_id


# --------------------------------------------------------------------------- GGUF

_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_GGUF_INTEGERS = frozenset({0, 1, 2, 3, 4, 5, 10, 11})


class _GGUFMetadata:
    """A bounds-checked cursor over a GGUF file's bytes (a read-only mmap)."""

    def __init__(self, data: Any, size: int, name: str) -> None:
        self.data, self.size, self.name, self.pos = data, size, name, 0

    def fail(self, field: str, problem: str, offset: int | None = None) -> VocabularyError:
        where = self.pos if offset is None else offset
        return VocabularyError(f"{self.name}: malformed GGUF at offset {where} ({field}): {problem}")

    def take(self, count: int, field: str) -> int:
        """Claim ``count`` bytes at the cursor; returns where they start."""
        if count < 0 or count > self.size - self.pos:
            raise self.fail(field, f"{count} bytes needed, {self.size - self.pos} left in the file")
        start = self.pos
        self.pos += count
        return start

    def scalar(self, fmt: str, field: str) -> Any:
        start = self.take(struct.calcsize(fmt), field)
        return struct.unpack_from("<" + fmt, self.data, start)[0]

    def string(self, field: str, keep: bool = True) -> bytes | None:
        size = self.scalar("Q", field)
        start = self.take(size, field)
        return bytes(self.data[start : start + size]) if keep else None

    def value(self, kind: int, field: str, keep: bool) -> Any:
        if kind == _GGUF_STRING:
            return self.string(field, keep)
        if kind == _GGUF_ARRAY:
            item_kind, count = self.scalar("I", field), self.scalar("Q", field)
            if item_kind == _GGUF_STRING:
                if count > (self.size - self.pos) // 8:  # each string takes 8 bytes at least
                    raise self.fail(field, f"an array of {count} strings cannot fit in the rest of the file")
                if not keep:  # skipped without building anything
                    for i in range(count):
                        self.string(f"{field}[{i}]", keep=False)
                    return None
                return [self.string(f"{field}[{i}]") for i in range(count)]
            if item_kind not in _GGUF_SCALARS:
                raise self.fail(field, f"unsupported GGUF array item type {item_kind}")
            dtype = np.dtype("<" + _GGUF_SCALARS[item_kind])
            if count > (self.size - self.pos) // dtype.itemsize:
                raise self.fail(field, f"an array of {count} x {dtype.itemsize} bytes runs past the end of the file")
            start = self.take(count * dtype.itemsize, field)
            # copied out of the mapping, so the file can be closed
            return np.frombuffer(self.data, dtype=dtype, count=count, offset=start).copy() if keep else None
        if kind not in _GGUF_SCALARS:
            raise self.fail(field, f"unsupported GGUF value type {kind}")
        return self.scalar(_GGUF_SCALARS[kind], field)


def read_gguf_tokenizer(path: str | Path) -> dict[str, Any]:
    """Read the ``tokenizer.*`` metadata of a GGUF file.

    The file is memory-mapped and only its metadata section is touched (the tensors
    that follow it are never read, so resident memory does not grow with the file).
    Every length and count is checked against the file's size before anything is
    allocated; a malformed file raises :class:`VocabularyError` naming the offset and
    the field. String arrays come back as ``list[bytes]``, numeric arrays as numpy arrays.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentTypeError(f"a GGUF file is named by a path (str or os.PathLike), got {type(path).__name__}")
    path = Path(path)
    name = repr(str(path))
    try:
        with path.open("rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size < 24:
                raise VocabularyError(f"{name} is not a GGUF file ({size} bytes, shorter than a GGUF header)")
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _read_gguf(_GGUFMetadata(data, size, name))
    except OSError as exc:
        raise VocabularyError(f"cannot read GGUF file {name}: {exc}") from exc


def _read_gguf(reader: _GGUFMetadata) -> dict[str, Any]:
    if reader.data[:4] != b"GGUF":
        raise VocabularyError(f"{reader.name} is not a GGUF file (magic {bytes(reader.data[:4])!r})")
    reader.pos = 4
    version = reader.scalar("I", "version")
    if version < 2:
        raise VocabularyError(f"{reader.name}: GGUF version {version} is not supported (need >= 2)")
    reader.scalar("Q", "tensor_count")
    n_kv = reader.scalar("Q", "metadata_kv_count")
    if n_kv > (reader.size - reader.pos) // 12:  # a key length and a value type at least
        raise reader.fail("metadata_kv_count", f"{n_kv} entries cannot fit in the rest of the file")
    metadata: dict[str, Any] = {}
    for index in range(n_kv):
        raw_key = reader.string(f"metadata key #{index}")
        assert raw_key is not None
        key = raw_key.decode("utf-8", "replace")
        offset = reader.pos
        kind = reader.scalar("I", key)
        wanted = key.startswith("tokenizer.ggml.")
        value = reader.value(kind, key, keep=wanted)
        if wanted:
            metadata[key] = (kind, value, offset)
    return _check_tokenizer_fields(reader, metadata)


def _check_tokenizer_fields(reader: _GGUFMetadata, metadata: dict[str, Any]) -> dict[str, Any]:
    """The values of the tokenizer fields triemask reads, each checked for its type."""
    expected = {
        "tokenizer.ggml.model": "a string",
        "tokenizer.ggml.tokens": "an array of strings",
        "tokenizer.ggml.token_type": "an array of integers",
        "tokenizer.ggml.eos_token_id": "an integer",
        "tokenizer.ggml.eot_token_id": "an integer",
    }
    result: dict[str, Any] = {}
    for key, (kind, value, offset) in metadata.items():
        shape = expected.get(key)
        valid = (
            shape is None
            or (shape == "a string" and kind == _GGUF_STRING)
            or (shape == "an array of strings" and isinstance(value, list))
            or (shape == "an array of integers" and isinstance(value, np.ndarray) and value.dtype.kind in "iu")
            or (shape == "an integer" and kind in _GGUF_INTEGERS)
        )
        if not valid:
            raise reader.fail(key, f"expected {shape}, got GGUF value type {kind}", offset)
        result[key] = value
    return result
