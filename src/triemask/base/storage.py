"""The triemask file format: compiled automata as named, aligned arrays, without pickle.

A file is::

    offset 0    b"TRIEMASK"                      magic
    offset 8    uint32 format version            (FORMAT_VERSION)
    offset 12   uint32 header length H
    offset 16   uint32 CRC-32 of the header (zlib)
    offset 64   header: H bytes of UTF-8 JSON
    ...         arrays, each at a 64-byte aligned offset

The header holds the kind of object (``"trie"``, ``"dag"``, ``"lazy"``, ``"schema"``,
``"tools"``, ``"token_index"``), the triemask version that wrote it, the vocabulary
fingerprint, the set fingerprint, the object's scalar fields (``meta``) and, per array, its
dtype, shape, offset, size and checksums (:func:`checksum`, one per 4 MiB, so that loading
checks them on every core while the automaton is built). Arrays
are read with ``numpy.frombuffer`` over the file's bytes or over a read-only memory map,
so that loading copies nothing and processes mapping one file share its pages. Every
field is checked before it is used: a truncated, corrupt or foreign file, a newer format
or a different vocabulary raises :class:`~triemask.AutomatonFileError` naming what is
wrong. Files are written to a temporary name and renamed, so a reader never sees half a
file.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import secrets
import stat
import struct
import threading
import zlib
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from .._version import __version__
from . import kernels
from .errors import AutomatonFileError

logger = logging.getLogger("triemask")

MAGIC = b"TRIEMASK"
FORMAT_VERSION = 2  # 2: arrays checked by `checksum` (version 1 used zlib's CRC-32, half as fast)
_PREAMBLE = struct.Struct("<8sIII")
_ALIGN = 64
_DTYPES = {"|b1", "|u1", "<u2", "<i4", "<i8", "<u8"}  # what the automata hold
_MAX_HEADER = 1 << 22  # 4 MiB: a schema's fields take about 3.6 KB each; parsing 4 MiB of JSON costs <= ~130 MB
_CHUNK = 1 << 22  # arrays are checksummed in 4 MiB pieces, so that loading verifies them in parallel
_VERIFIERS: ThreadPoolExecutor | None = None
_VERIFIERS_LOCK = threading.Lock()


_K1, _K2, _K3 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_MASK = (1 << 64) - 1


def checksum(data: Any) -> int:
    """The file format's checksum of a run of bytes: the bytes as little-endian 64-bit words
    (the last one padded with zeros), word ``i`` mixed by a bijection of ``word + (i + 1) * K1``,
    the terms summed modulo 2**64 and the sum mixed with the length. Any change inside one
    word changes its term, so it is always caught. The C extension computes it at memory
    speed with the GIL released (about twice zlib's CRC-32); this is the NumPy reference."""
    native = kernels.KERNELS
    if native is not None:
        return int(native.checksum(data))
    raw = memoryview(data).cast("B")
    n = len(raw)
    words = np.zeros(-(-n // 8), dtype="<u8")
    words.view(np.uint8)[:n] = np.frombuffer(raw, dtype=np.uint8)
    x = words.astype(np.uint64) + np.arange(1, len(words) + 1, dtype=np.uint64) * np.uint64(_K1)
    x ^= x >> np.uint64(31)
    x *= np.uint64(_K2)
    x ^= x >> np.uint64(29)
    h = (int(x.sum(dtype=np.uint64)) + n) & _MASK
    h ^= h >> 33
    h = (h * _K3) & _MASK
    return h ^ (h >> 33)


def _pieces(array: npt.NDArray[Any]) -> list[memoryview]:
    """An array's bytes in 4 MiB pieces (one, empty, for an empty array)."""
    raw = array.data.cast("B")
    return [raw[start : start + _CHUNK] for start in range(0, max(len(raw), 1), _CHUNK)]


def _verifiers() -> ThreadPoolExecutor:
    global _VERIFIERS
    with _VERIFIERS_LOCK:
        if _VERIFIERS is None:  # the C checksum releases the GIL: the pieces are checked on every core
            _VERIFIERS = ThreadPoolExecutor(max_workers=os.cpu_count() or 2, thread_name_prefix="triemask-verify")
        return _VERIFIERS


_REFUSED_DIRECTORIES: set[str] = set()


def trusted_directory(directory: Path) -> tuple[Path | None, str]:
    """``(directory, "")`` when files there can be trusted and written, else ``(None, why)``:
    a folder owned by another user or writable by others (anyone could put a file there that
    this process would load) is refused with one warning per process; one this process cannot
    enter or write is skipped. A folder that does not exist yet is made by its first writer."""
    try:
        status = directory.stat()
    except FileNotFoundError:
        return directory, ""
    except OSError as error:
        return None, f"cannot look at {str(directory)!r}: {error.strerror or error}"
    why = ""
    if not stat.S_ISDIR(status.st_mode):
        why = "it is not a folder"
    elif hasattr(os, "geteuid") and status.st_uid != os.geteuid():
        why = f"it is owned by user {status.st_uid}, not by this process's ({os.geteuid()})"
    elif status.st_mode & 0o022:
        why = f"others may write into it (mode {stat.S_IMODE(status.st_mode):o})"
    if why:
        if str(directory) not in _REFUSED_DIRECTORIES:
            _REFUSED_DIRECTORIES.add(str(directory))
            logger.warning("triemask does not use the cache folder %s: %s", directory, why)
        return None, f"the cache folder {str(directory)!r} is not used: {why}"
    if not os.access(directory, os.R_OK | os.W_OK | os.X_OK):
        return None, f"cannot read and write in {str(directory)!r}"
    return directory, ""


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
        """Start checking every array's checksums on worker threads (the C checksum releases
        the GIL) while the caller builds the automaton; the returned function waits for every
        one of them, then raises AutomatonFileError naming the first array that fails."""
        checks = []
        for name, array in self.arrays.items():
            expected = self.header["arrays"][name]["checksums"]
            for piece, sum_ in zip(_pieces(array), expected, strict=True):
                checks.append((name, sum_, _verifiers().submit(checksum, piece)))

        def wait() -> None:
            # Every piece's check ends before this returns or raises: the caller may close the
            # buffer, or anyone may cut the file, as soon as it has an answer, and a check still
            # reading a cut mapping would kill the process (SIGBUS), not raise.
            futures.wait([found for _, _, found in checks])
            for name, expected, found in checks:
                if found.result() != expected:
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
                "checksums": [checksum(piece) for piece in _pieces(data)],
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
    fields, every array's bounds, dtype and shape, and with ``verify`` every array's checksums."""
    if isinstance(source, bytes):
        buffer: Any = source
        name = "the serialised automaton"
    else:
        name = f"file {os.fspath(source)!r}"
        try:
            buffer = read_regular_file(source, name, use_mmap=use_mmap)
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
    if version < FORMAT_VERSION:
        raise AutomatonFileError(
            f"{name} has format version {version}, older than this triemask reads ({FORMAT_VERSION}): "
            "compile it again (caches do so by themselves)",
            field="format_version",
        )
    if header_length > _MAX_HEADER:
        raise AutomatonFileError(
            f"{name} is corrupt: its header claims {header_length} bytes, more than the format allows ({_MAX_HEADER})",
            field="header",
        )
    if header_length > size - _ALIGN:
        raise AutomatonFileError(f"{name} is truncated: its header needs {header_length} bytes", field="size")
    text = bytes(buffer[_ALIGN : _ALIGN + header_length])
    if zlib.crc32(text) != header_crc:
        raise AutomatonFileError(f"{name} is corrupt: the header's checksum does not match", field="header")
    try:
        header = json.loads(text)  # (its size is bounded above; its depth by RecursionError)
        kind, entries, total = header["kind"], header["arrays"], header["file_bytes"]
        for key in ("vocab_fingerprint", "set_fingerprint", "triemask_version"):
            if not isinstance(header[key], str):
                raise TypeError(key)
        if not isinstance(header["meta"], dict) or not isinstance(entries, dict) or type(total) is not int:
            raise TypeError("meta, arrays or file_bytes")
    except (ValueError, KeyError, TypeError, RecursionError) as error:
        raise AutomatonFileError(
            f"{name} is corrupt: its header is unreadable ({type(error).__name__}: {error})", field="header"
        ) from None
    if kind not in kinds:
        raise AutomatonFileError(f"{name} holds a {kind!r}, not one of {', '.join(kinds)}", field="kind")
    if total > size:
        raise AutomatonFileError(f"{name} is truncated: {size} of its {total} bytes", field="size")
    arrays: dict[str, npt.NDArray[Any]] = {}
    for array_name, entry in entries.items():
        arrays[array_name] = _array(buffer, name, array_name, entry, size, verify)
    return Stored(header, arrays, name)


def read_regular_file(
    source: str | os.PathLike[str], name: str, *, use_mmap: bool = False, max_bytes: int | None = None
) -> Any:
    """The bytes of a regular file (mapped read-only, or read, at most its size when opened):
    a FIFO, a device (a link to ``/dev/zero``), a folder or a file over ``max_bytes`` are
    refused (AutomatonFileError naming ``name``) before any byte is read, and opening never
    blocks. OSError where the file cannot be opened."""
    handle = os.open(source, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        status = os.fstat(handle)
        if not stat.S_ISREG(status.st_mode):
            raise AutomatonFileError(f"{name} is not a regular file (a FIFO, a device or a folder)", field="file")
        if max_bytes is not None and status.st_size > max_bytes:
            raise AutomatonFileError(f"{name} has {status.st_size} bytes, more than {max_bytes}", field="size")
        if use_mmap and status.st_size:
            return mmap.mmap(handle, 0, access=mmap.ACCESS_READ)
        with os.fdopen(os.dup(handle), "rb") as f:
            return f.read(status.st_size)
    finally:
        os.close(handle)


_T = TypeVar("_T")


def load(
    source: str | os.PathLike[str],
    *,
    kinds: tuple[str, ...],
    vocab_fingerprint: str,
    build: Callable[[Stored], _T],
    use_mmap: bool = True,
    verify: bool = True,
) -> _T:
    """Read a file, check it was written for the vocabulary with ``vocab_fingerprint``, and
    ``build`` its object from it while (with ``verify``) the arrays' checksums are checked on
    worker threads; a corrupt array is named before any error of ``build``."""
    stored = read(source, use_mmap=use_mmap, verify=False, kinds=kinds)
    stored.check_vocabulary(vocab_fingerprint)
    checked = stored.verify_in_background() if verify else None
    try:
        return build(stored)
    finally:
        if checked is not None:
            checked()


def _array(buffer: Any, name: str, array_name: str, entry: Any, size: int, verify: bool) -> npt.NDArray[Any]:
    try:
        dtype, shape, offset, nbytes, sums = (entry[k] for k in ("dtype", "shape", "offset", "nbytes", "checksums"))
        if dtype not in _DTYPES or not isinstance(shape, list) or len(shape) != 1:
            raise TypeError(f"dtype {dtype!r} shape {shape!r}")
        pieces = max(1, -(-nbytes // _CHUNK))
        if not isinstance(sums, list) or len(sums) != pieces or not all(type(c) is int for c in sums):
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
    if verify and [checksum(piece) for piece in _pieces(array)] != sums:
        raise AutomatonFileError(f"{name} is corrupt: array {array_name!r} fails its checksum", field=array_name)
    return array
