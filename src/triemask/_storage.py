"""The triemask file format: compiled automata as named, aligned arrays, without pickle.

A file is::

    offset 0    b"TRIEMASK"                      magic
    offset 8    uint32 format version            (FORMAT_VERSION)
    offset 12   uint32 header length H
    offset 16   uint32 CRC-32 of the header
    offset 64   header: H bytes of UTF-8 JSON
    ...         arrays, each at a 64-byte aligned offset

The header holds the kind of object (``"trie"``, ``"dag"``, ``"lazy"``), the triemask
version that wrote it, the vocabulary fingerprint, the set fingerprint, the object's
scalar fields (``meta``) and, per array, its dtype, shape, offset, size and CRC-32s (one
per 4 MiB, so that loading checks them on every core while the automaton is built). Arrays
are read with ``numpy.frombuffer`` over the file's bytes or over a read-only memory map,
so that loading copies nothing and processes mapping one file share its pages. Every
field is checked before it is used: a truncated, corrupt or foreign file, a newer format
or a different vocabulary raises :class:`~triemask.AutomatonFileError` naming what is
wrong. Files are written to a temporary name and renamed, so a reader never sees half a
file.
"""

from __future__ import annotations

import json
import mmap
import os
import secrets
import struct
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ._errors import AutomatonFileError

__all__ = ["FORMAT_VERSION", "Stored", "cache_directory", "read", "to_bytes", "write"]

MAGIC = b"TRIEMASK"
FORMAT_VERSION = 1
_PREAMBLE = struct.Struct("<8sIII")
_ALIGN = 64
_DTYPES = {"|b1", "|u1", "<u2", "<i4", "<i8", "<u8"}  # what the automata hold
_MAX_HEADER = 1 << 24
_CHUNK = 1 << 22  # arrays are checksummed in 4 MiB pieces, so that loading verifies them in parallel
_VERIFIERS: ThreadPoolExecutor | None = None
_VERIFIERS_LOCK = threading.Lock()


def _chunk_crcs(array: npt.NDArray[Any]) -> list[int]:
    """The CRC-32 of each 4 MiB piece of an array's bytes (one for an empty array)."""
    raw = array.data.cast("B")
    return [zlib.crc32(raw[start : start + _CHUNK]) for start in range(0, max(len(raw), 1), _CHUNK)]


def _verifiers() -> ThreadPoolExecutor:
    global _VERIFIERS
    with _VERIFIERS_LOCK:
        if _VERIFIERS is None:  # zlib releases the GIL: the pieces are checked on every core
            _VERIFIERS = ThreadPoolExecutor(max_workers=os.cpu_count() or 2, thread_name_prefix="triemask-verify")
        return _VERIFIERS


def cache_directory() -> Path:
    """Where triemask keeps files between processes: ``$TRIEMASK_CACHE``, else
    ``~/.cache/triemask`` (``$XDG_CACHE_HOME/triemask`` when that is set)."""
    configured = os.environ.get("TRIEMASK_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "triemask"


class Stored:
    """What a file holds: its header fields and arrays (read-only views into the file)."""

    __slots__ = ("arrays", "header", "source")

    def __init__(self, header: dict[str, Any], arrays: dict[str, npt.NDArray[Any]], source: str) -> None:
        self.header = header
        self.arrays = arrays
        self.source = source

    def verify_in_background(self) -> Callable[[], None]:
        """Start checking every array's checksums on worker threads (zlib releases the GIL)
        while the caller builds the automaton; the returned function waits for them and
        raises AutomatonFileError naming the first array that fails."""
        checks = []
        for name, array in self.arrays.items():
            raw = array.data.cast("B")
            expected = self.header["arrays"][name]["crc32"]
            for i, start in enumerate(range(0, max(len(raw), 1), _CHUNK)):
                checks.append((name, expected[i], _verifiers().submit(zlib.crc32, raw[start : start + _CHUNK])))

        def wait() -> None:
            for name, expected, crc in checks:
                if crc.result() != expected:
                    raise AutomatonFileError(f"{self.source} is corrupt: array {name!r} fails its checksum", field=name)

        return wait

    @property
    def kind(self) -> str:
        return str(self.header["kind"])

    @property
    def meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = self.header["meta"]
        return meta

    def check_vocabulary(self, fingerprint: str) -> None:
        """Raise unless the file was written for the vocabulary with this fingerprint."""
        stored = self.header["vocab_fingerprint"]
        if stored != fingerprint:
            raise AutomatonFileError(
                f"{self.source} was compiled for the vocabulary with fingerprint {stored}, not for this one "
                f"({fingerprint}): load it with the vocabulary it was compiled for, or recompile",
                field="vocab_fingerprint",
            )


def _layout(
    kind: str, meta: dict[str, Any], arrays: dict[str, npt.NDArray[Any]], vocab_fingerprint: str, set_fingerprint: str
) -> tuple[bytes, list[tuple[int, npt.NDArray[Any]]], int]:
    from . import __version__

    entries: dict[str, Any] = {}
    placed: list[tuple[int, npt.NDArray[Any]]] = []
    header: dict[str, Any] = {}
    # The header's size decides where the arrays start: lay out twice (the second time with
    # offsets of the final width) until the size is stable.
    start = _ALIGN
    for _ in range(4):
        offset = start
        entries, placed = {}, []
        for name, array in arrays.items():
            data = np.ascontiguousarray(array)
            if data.dtype.byteorder == ">" or (data.dtype.byteorder == "=" and not np.little_endian):
                data = data.astype(data.dtype.newbyteorder("<"))
            entries[name] = {
                "dtype": data.dtype.str,
                "shape": list(data.shape),
                "offset": offset,
                "nbytes": data.nbytes,
                "crc32": _chunk_crcs(data),
            }
            placed.append((offset, data))
            offset += -(-data.nbytes // _ALIGN) * _ALIGN
        header = {
            "kind": kind,
            "triemask_version": __version__,
            "vocab_fingerprint": vocab_fingerprint,
            "set_fingerprint": set_fingerprint,
            "meta": meta,
            "arrays": entries,
            "file_bytes": offset,
        }
        text = json.dumps(header, sort_keys=True).encode()
        needed = -(-(_ALIGN + len(text)) // _ALIGN) * _ALIGN
        if needed == start:
            return text, placed, offset
        start = needed
    raise AssertionError("the header's size did not settle")  # pragma: no cover


def _serialise(
    target: Any,
    kind: str,
    meta: dict[str, Any],
    arrays: dict[str, npt.NDArray[Any]],
    vocab_fingerprint: str,
    set_fingerprint: str,
) -> None:
    text, placed, total = _layout(kind, meta, arrays, vocab_fingerprint, set_fingerprint)
    target.write(_PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(text), zlib.crc32(text)).ljust(_ALIGN, b"\0"))
    target.write(text)
    position = _ALIGN + len(text)
    for offset, data in placed:
        target.write(b"\0" * (offset - position))
        target.write(data.data.cast("B"))
        position = offset + data.nbytes
    target.write(b"\0" * (total - position))


def write(
    path: str | os.PathLike[str],
    kind: str,
    meta: dict[str, Any],
    arrays: dict[str, npt.NDArray[Any]],
    *,
    vocab_fingerprint: str,
    set_fingerprint: str,
) -> None:
    """Write a file atomically (a temporary file in the same folder, then a rename)."""
    target = Path(path)
    temporary = target.parent / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.part"
    # os.open with mode 0o666: the process's umask applies, as for any file it writes
    handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(handle, "wb") as out:
            _serialise(out, kind, meta, arrays, vocab_fingerprint, set_fingerprint)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def to_bytes(
    kind: str,
    meta: dict[str, Any],
    arrays: dict[str, npt.NDArray[Any]],
    *,
    vocab_fingerprint: str,
    set_fingerprint: str,
) -> bytes:
    """The file's bytes, in memory (pickling goes through the format)."""
    import io

    out = io.BytesIO()
    _serialise(out, kind, meta, arrays, vocab_fingerprint, set_fingerprint)
    return out.getvalue()


def read(
    source: str | os.PathLike[str] | bytes, *, use_mmap: bool = True, verify: bool = True, kinds: tuple[str, ...]
) -> Stored:
    """Read a file (or its bytes) and check it: magic, format version, header checksum and
    fields, every array's bounds, dtype and shape, and with ``verify`` every array's CRC-32."""
    if isinstance(source, bytes):
        buffer: Any = source
        name = "the serialised automaton"
    else:
        name = f"file {os.fspath(source)!r}"
        try:
            with open(source, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if use_mmap and size else f.read()
        except OSError as error:
            raise AutomatonFileError(f"cannot read {name}: {error.strerror or error}", field="file") from None
    size = len(buffer)
    if size < _ALIGN:
        raise AutomatonFileError(f"{name} is truncated: {size} bytes, shorter than the format's preamble", field="size")
    magic, version, header_length, header_crc = _PREAMBLE.unpack_from(buffer, 0)
    if magic != MAGIC:
        raise AutomatonFileError(f"{name} is not a triemask file (magic {magic!r})", field="magic")
    if version > FORMAT_VERSION:
        raise AutomatonFileError(
            f"{name} has format version {version}, newer than this triemask reads ({FORMAT_VERSION}): upgrade triemask",
            field="format_version",
        )
    if version < 1:
        raise AutomatonFileError(f"{name} has format version {version}, which does not exist", field="format_version")
    if header_length > min(size - _ALIGN, _MAX_HEADER):
        raise AutomatonFileError(f"{name} is truncated: its header needs {header_length} bytes", field="size")
    text = bytes(buffer[_ALIGN : _ALIGN + header_length])
    if zlib.crc32(text) != header_crc:
        raise AutomatonFileError(f"{name} is corrupt: the header's checksum does not match", field="header")
    try:
        header = json.loads(text)
        kind, entries, total = header["kind"], header["arrays"], header["file_bytes"]
        for key in ("vocab_fingerprint", "set_fingerprint", "triemask_version"):
            if not isinstance(header[key], str):
                raise TypeError(key)
        if not isinstance(header["meta"], dict) or not isinstance(entries, dict) or type(total) is not int:
            raise TypeError("meta, arrays or file_bytes")
    except (ValueError, KeyError, TypeError) as error:
        raise AutomatonFileError(f"{name} is corrupt: its header is unreadable ({error})", field="header") from None
    if kind not in kinds:
        raise AutomatonFileError(f"{name} holds a {kind!r}, not one of {', '.join(kinds)}", field="kind")
    if total > size:
        raise AutomatonFileError(f"{name} is truncated: {size} of its {total} bytes", field="size")
    arrays: dict[str, npt.NDArray[Any]] = {}
    for array_name, entry in entries.items():
        arrays[array_name] = _array(buffer, name, array_name, entry, size, verify)
    return Stored(header, arrays, name)


def _array(buffer: Any, name: str, array_name: str, entry: Any, size: int, verify: bool) -> npt.NDArray[Any]:
    try:
        dtype, shape, offset, nbytes, crc = (entry[k] for k in ("dtype", "shape", "offset", "nbytes", "crc32"))
        if dtype not in _DTYPES or not isinstance(shape, list) or len(shape) != 1:
            raise TypeError(f"dtype {dtype!r} shape {shape!r}")
        pieces = max(1, -(-nbytes // _CHUNK))
        if not isinstance(crc, list) or len(crc) != pieces or not all(type(c) is int for c in crc):
            raise TypeError(f"{pieces} checksums expected")
        if not all(type(x) is int and x >= 0 for x in (*shape, offset, nbytes)):
            raise TypeError("negative or non-integer sizes")
    except (KeyError, TypeError) as error:
        raise AutomatonFileError(
            f"{name} is corrupt: array {array_name!r} is described wrongly ({error})", field=array_name
        ) from None
    itemsize = np.dtype(dtype).itemsize
    if nbytes != shape[0] * itemsize or offset % _ALIGN or offset < _ALIGN or offset + nbytes > size:
        raise AutomatonFileError(
            f"{name} is corrupt or truncated: array {array_name!r} ({nbytes} bytes at {offset}) lies outside the file",
            field=array_name,
        )
    array = np.frombuffer(buffer, dtype=np.dtype(dtype), count=shape[0], offset=offset)
    if verify and _chunk_crcs(array) != crc:
        raise AutomatonFileError(f"{name} is corrupt: array {array_name!r} fails its checksum", field=array_name)
    return array
