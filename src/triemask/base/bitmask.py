"""Token bitmasks in the layout shared by xgrammar, llguidance and vLLM.

A bitmask for a batch is an ``int32`` array of shape ``(batch, ceil(vocab_size / 32))``;
bit ``i % 32`` of word ``i // 32`` of a row is set when token ``i`` is allowed.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import numpy.typing as npt

from .errors import ArgumentTypeError, BitmaskError, integer

INT32 = np.dtype(np.int32)  # the bitmask dtype, compared by identity on the per-step path


def bitmask_width(vocab_size: int) -> int:
    """Number of ``int32`` words per bitmask row: ``ceil(vocab_size / 32)``."""
    return (integer(vocab_size, "vocab_size", ArgumentTypeError, "an integer") + 31) // 32


def allocate_token_bitmask(batch_size: int, vocab_size: int) -> npt.NDArray[np.int32]:
    """A new ``(batch_size, ceil(vocab_size / 32))`` int32 bitmask with every token allowed.

    Rows start as all ones (-1), like xgrammar's ``allocate_token_bitmask``: a row no
    automaton fills leaves its request unconstrained.

    Examples
    --------
    >>> allocate_token_bitmask(2, 100).shape
    (2, 4)
    """
    batch_size = integer(batch_size, "batch_size", ArgumentTypeError, "an integer")
    vocab_size = integer(vocab_size, "vocab_size", ArgumentTypeError, "an integer")
    if not 0 <= batch_size < 1 << 31 or not 0 < vocab_size <= 1 << 31:
        raise BitmaskError(
            f"need 0 <= batch_size < 2**31 and 0 < vocab_size <= 2**31, got {batch_size} and {vocab_size}"
        )
    return np.full((int(batch_size), bitmask_width(vocab_size)), -1, dtype=np.int32)


def as_bitmask_array(bitmask: Any, vocab_size: int) -> npt.NDArray[np.int32]:
    """View ``bitmask`` (numpy array or CPU torch tensor) as a writable 2-D int32 array.

    A 1-D buffer is taken as a single row. The result shares memory with
    ``bitmask``, so writing it writes the caller's buffer.
    """
    width = (vocab_size + 31) // 32
    if type(bitmask) is np.ndarray and bitmask.dtype is INT32 and bitmask.ndim == 2:
        flags = bitmask.flags  # one flags object for both checks
        if bitmask.shape[1] == width and flags.c_contiguous and flags.writeable:
            return bitmask  # the common case, checked cheaply
    expected = f"an int32 array of shape (batch, {width}) = (batch, ceil(vocab_size={vocab_size} / 32)), C-contiguous"
    if type(bitmask).__module__.split(".")[0] == "torch":
        device = str(bitmask.device)
        if device != "cpu":
            raise BitmaskError(
                f"bitmask is a torch tensor on {device}; fill_bitmask writes host memory: fill a CPU "
                "(ideally pinned) tensor and copy it to the device"
            )
        if str(bitmask.dtype) != "torch.int32" or not bitmask.is_contiguous():
            raise BitmaskError(
                f"expected {expected}; got a torch tensor of dtype {bitmask.dtype}, shape {tuple(bitmask.shape)}"
            )
        array = cast("npt.NDArray[np.int32]", bitmask.numpy())
    elif isinstance(bitmask, np.ndarray):
        array = bitmask
    else:
        raise BitmaskError(f"expected {expected}; got {type(bitmask).__module__}.{type(bitmask).__qualname__}")
    if array.ndim == 1:
        array = array[None, :]
    if array.dtype != np.int32 or array.ndim != 2 or array.shape[1] != width or not array.flags.c_contiguous:
        layout = "C-contiguous" if array.flags.c_contiguous else "not C-contiguous"
        raise BitmaskError(f"expected {expected}; got dtype {array.dtype}, shape {array.shape}, {layout}")
    if not array.flags.writeable:
        raise BitmaskError("the bitmask is read-only; pass a writable buffer")
    return array


def unpack_bitmask(bitmask: npt.NDArray[np.int32], width: int) -> npt.NDArray[np.bool_]:
    """The rows of an int32 bitmask as booleans, ``(rows, width)``: column ``i`` is bit
    ``i % 32`` of word ``i // 32`` (``width`` at most 32 times the words)."""
    bits = np.unpackbits(np.ascontiguousarray(bitmask).view(np.uint8), axis=1, bitorder="little")
    unpacked: npt.NDArray[np.bool_] = bits[:, :width].astype(bool)
    return unpacked
