"""Value sets: the one owner of how values are encoded (UTF-8, one buffer) and fingerprinted."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from itertools import pairwise
from typing import Any

import numpy as np
import numpy.typing as npt

from . import kernels
from .errors import ValueSetError


def sorted_unique(items: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``np.unique`` of a 1-D array, by a sort and a compare: NumPy 2.3's ``np.unique`` hashes
    integers first, 10x slower on the arrays of a compile (3,000 trie nodes: 150 us, 12 here)."""
    ordered: npt.NDArray[Any] = np.sort(items)
    first = np.ones(len(ordered), dtype=bool)
    first[1:] = ordered[1:] != ordered[:-1]
    found: npt.NDArray[Any] = ordered[first]
    return found


def set_fingerprint(flat: npt.NDArray[np.uint8], starts: npt.NDArray[Any], are_str: bool) -> str:
    """The fingerprint of a set of values from its distinct values in sorted order
    (concatenated, with their offsets): the same set in any order, with any duplicates,
    has the same fingerprint."""
    digest = hashlib.blake2b(b"str" if are_str else b"bytes", digest_size=16)
    digest.update(np.ascontiguousarray(starts, dtype="<i8").tobytes())
    digest.update(np.ascontiguousarray(flat, dtype=np.uint8).tobytes())
    return digest.hexdigest()


def encode_values(
    values: Iterable[str] | Iterable[bytes],
) -> tuple[list[Any], list[bytes] | None, npt.NDArray[np.uint8], npt.NDArray[np.int64], bool]:
    """The values as UTF-8: one buffer plus offsets (and a list of bytes for the NumPy
    trie construction), without a Python loop over the values when they hold no NUL."""
    if not isinstance(values, Iterable):
        raise ValueSetError(f"values must be an iterable of strings, got {type(values).__name__} {values!r:.40}")
    if isinstance(values, (str, bytes, bytearray)):
        raise ValueSetError(
            f"values must be an iterable of strings, got a single {type(values).__name__} {values[:40]!r}; "
            "wrap it in a list"
        )
    items: list[Any] = values if isinstance(values, list) else list(values)
    if not items:
        raise ValueSetError("cannot compile an empty set of values")
    try:
        joined = "\x00".join(items)
        are_str = True
    except TypeError:
        joined = None
        are_str = False
    if are_str:
        assert joined is not None
        try:
            data = joined.encode("utf-8")
        except UnicodeEncodeError:
            for i, item in enumerate(items):
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError as exc:  # noqa: PERF203 - only on the error path
                    raise ValueSetError(f"value #{i} {item!r} is not valid Unicode: {exc.reason}") from None
            raise
    else:
        expected = str if isinstance(items[0], str) else (bytes, bytearray, memoryview)
        for i, item in enumerate(() if set(map(type, items)) <= {bytes} else items):  # (bytes: one C pass)
            if not isinstance(item, expected):
                raise ValueSetError(
                    f"values must be all str or all bytes; value #{i} is {type(item).__name__}: {item!r}"
                )
        data = b"\x00".join(items)
    raw = np.frombuffer(data, dtype=np.uint8)
    cuts = np.flatnonzero(raw == 0)
    k = len(items)
    strings: list[bytes] | None
    if len(cuts) != k - 1:  # some value holds a NUL: encode one by one
        encoded = [item.encode("utf-8") if are_str else bytes(item) for item in items]
        flat = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=k)
        strings = encoded
    else:
        # (the NumPy trie construction pads Python bytes faster; the C one reads flat)
        strings = data.split(b"\x00") if kernels.KERNELS is None else None
        keep = np.ones(len(raw), dtype=bool)
        keep[cuts] = False
        flat = raw[keep]
        bounds = np.concatenate(([-1], cuts, [len(raw)]))
        lengths = np.diff(bounds) - 1
    starts = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    return items, strings, flat, starts, are_str


def values_fingerprint(values: Iterable[str] | Iterable[bytes]) -> str:
    """The :attr:`~triemask.TrieAutomaton.set_fingerprint` a set will have, without compiling
    it: a hash of its distinct values in sorted byte order (order and duplicates do not
    matter). Raises ValueSetError for what ``compile`` would refuse as a set of values (the
    same checks and messages: :func:`encode_values`)."""
    _, _, flat, starts, are_str = encode_values(values)
    data = flat.tobytes()
    bounds = starts.tolist()
    distinct = sorted({data[a:b] for a, b in pairwise(bounds)})
    sorted_starts = np.zeros(len(distinct) + 1, dtype=np.int64)
    np.cumsum([len(v) for v in distinct], out=sorted_starts[1:])
    return set_fingerprint(np.frombuffer(b"".join(distinct), dtype=np.uint8), sorted_starts, are_str)
