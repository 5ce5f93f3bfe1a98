"""Registered sets: files named by TRIEMASK_SETS, reloaded when they change."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from ...base import AutomatonFileError, read_regular_file
from .limits import SETS_ENV

logger = logging.getLogger("triemask")

MAX_SET_FILE_BYTES = 1 << 30  # a registered set's file: larger ones (or a link to /dev/zero) are refused


def _read_set_file(file: Path) -> list[str]:
    """One value per line: strict UTF-8 (a leading byte-order mark dropped), lines
    split at ``\n`` or ``\r\n`` only (a value may hold any other character). Only a
    regular file of at most :data:`MAX_SET_FILE_BYTES` is read (a FIFO would block the
    reader, a device would never end), opened without blocking."""
    try:
        raw = read_regular_file(file, str(file), max_bytes=MAX_SET_FILE_BYTES)
    except AutomatonFileError as error:
        raise ValueError(f"{SETS_ENV}: {error}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{SETS_ENV}: {file} is not UTF-8: byte 0x{raw[error.start]:02x} at offset {error.start}"
        ) from None
    text = text.removeprefix("\ufeff")
    values = [line.removesuffix("\r") for line in text.split("\n")]
    return [value for value in values if value]


def load_sets(path: str | os.PathLike[str]) -> dict[str, list[str]]:
    """Named sets from a file (one value per line, named by the file's stem) or a folder
    of ``*.txt`` such files. Empty lines are skipped. Raises ``ValueError`` naming the
    file for anything unusable."""
    root = Path(path)
    if not root.exists():
        raise ValueError(f"{SETS_ENV}={str(path)!r}: no such file or folder")
    files = sorted(root.glob("*.txt")) if root.is_dir() else [root]
    if not files:
        raise ValueError(f"{SETS_ENV}={str(path)!r}: the folder holds no *.txt file")
    sets = {}
    for file in files:
        try:
            values = _read_set_file(file)
        except OSError as error:
            raise ValueError(f"{SETS_ENV}: cannot read {file}: {error.strerror}") from None
        if not values:
            raise ValueError(f"{SETS_ENV}: {file} holds no value")
        sets[file.stem] = values
    return sets


_REGISTERED: dict[str, list[str]] | Exception | None = None
_REGISTERED_LOCK = threading.Lock()
_REGISTERED_STATE: dict[str, Any] = {"signature": None, "checked": 0.0, "generation": 0}
RELOAD_SECONDS = 2.0  # how often the registered sets' files are looked at for changes


def _signature(path: str) -> tuple[tuple[str, int, int], ...] | None:
    """The registered files' names, modification times and sizes (None when unreadable)."""
    root = Path(path)
    try:
        files = sorted(root.glob("*.txt")) if root.is_dir() else [root]
        return tuple((f.name, f.stat().st_mtime_ns, f.stat().st_size) for f in files)
    except OSError:
        return None


def registered_sets() -> dict[str, list[str]]:
    """The sets named by ``$TRIEMASK_SETS`` (empty when unset).

    Read at the first call; a failure then is kept and raised again without reading again
    (the server does not start). After that, the files are looked at every
    :data:`RELOAD_SECONDS`: a set whose file changed (or a file added or removed) is read
    again, so a set is updated by name without a restart; a change that cannot be read
    keeps the previous sets and is logged."""
    global _REGISTERED
    with _REGISTERED_LOCK:
        path = os.environ.get(SETS_ENV)
        if _REGISTERED is None:
            try:
                _REGISTERED = load_sets(path) if path else {}
                _REGISTERED_STATE["signature"] = _signature(path) if path else None
            except ValueError as error:
                _REGISTERED = error
            _REGISTERED_STATE["checked"] = time.monotonic()
        due = (
            path
            and not isinstance(_REGISTERED, Exception)
            and (time.monotonic() - float(_REGISTERED_STATE["checked"] or 0.0) >= RELOAD_SECONDS)
        )
        if due:  # one caller looks (the others serve the current sets meanwhile)
            _REGISTERED_STATE["checked"] = time.monotonic()
        current = _REGISTERED
    if due:
        _reload(str(path))  # reading files happens outside the lock: admission never waits on a disk
        with _REGISTERED_LOCK:
            current = _REGISTERED
    if isinstance(current, Exception):
        raise current
    return current


def _reload(path: str) -> None:
    """Read the registered sets again if their files changed (outside the registry lock)."""
    global _REGISTERED
    signature = _signature(path)
    with _REGISTERED_LOCK:
        if signature is None or signature == _REGISTERED_STATE["signature"]:
            return
    try:
        loaded = load_sets(path)
    except ValueError as error:  # keep serving the previous sets
        with _REGISTERED_LOCK:
            _REGISTERED_STATE["signature"] = signature
        logger.warning("triemask: registered sets not reloaded, the previous ones stay: %s", error)
        return
    with _REGISTERED_LOCK:
        _REGISTERED = loaded
        _REGISTERED_STATE["signature"] = signature
        _REGISTERED_STATE["generation"] = int(_REGISTERED_STATE["generation"] or 0) + 1
    logger.info("triemask: registered sets reloaded (%s)", ", ".join(sorted(loaded)))


def registered_generation() -> int:
    """How many times the registered sets were reloaded (0 until a file changes)."""
    with _REGISTERED_LOCK:
        return int(_REGISTERED_STATE["generation"] or 0)
