"""Coverage-guided fuzzing of the C kernel's inputs with atheris, run by hand:

    pip install atheris
    python tests/fuzz_native.py -max_total_time=600
    make test-asan                       # the same kernel under AddressSanitizer and UBSan

An input becomes a kernel's five arrays and sizes, then calls with arbitrary states, tokens,
rows and bitmasks. Each kernel must be refused with ValueError or answer every call with a
result in range or None (deferring to Python); anything else (a crash, a sanitizer report,
an out-of-range state) is a finding. test_native.py runs the same target briefly in
`make test`, with hypothesis.
"""

from __future__ import annotations

import sys

import numpy as np


def kernel_target(data: bytes) -> None:

    raw = np.frombuffer(data[: len(data) // 4 * 4], dtype=np.int32) % 16 - 3
    if len(raw) < 9:
        return
    num_nodes, num_states, width = int(raw[0] % 5), int(raw[1] % 9), int(raw[2] % 4) + 1
    sizes = [int(x) % 7 for x in raw[3:8]]
    dense_min = int(raw[8] % 4)
    values = raw[9:]
    arrays, at = [], 0
    for size in sizes:
        chunk = np.resize(values[at : at + size], size) if size else np.zeros(0, dtype=np.int32)
        at += size
        arrays.append(chunk.astype(np.int32))
    exercise_kernel(arrays, num_nodes, num_states, width, values, dense_min)


def exercise_kernel(
    arrays: list[np.ndarray], num_nodes: int, num_states: int, width: int, values: np.ndarray, dense_min: int = 1
) -> None:
    """Build a kernel from arbitrary arrays (or see it refused) and call everything on it."""
    from triemask.base import _native as _native

    try:
        kernel = _native.Kernel(*arrays, num_nodes, num_states, width, dense_min)
    except ValueError:
        return
    bitmask = np.zeros((3, width), dtype=np.int32)
    for state in range(-2, num_states + 2):
        for token in range(-1, 9):
            following = kernel.next(state, token)
            assert following is None or -1 <= following < num_states, following
        for row in (-1, 0, 2, 3):
            kernel.fill(bitmask, row, state)
    kernel.fill_batch(bitmask, [int(x) for x in values[:3]], None)
    kernel.fill_batch(bitmask, np.asarray(values[:3], dtype=np.int64), [2, 1, 0][: len(values[:3])])
    out = np.zeros(len(values), dtype=np.int32)
    kernel.next_batch(values.astype(np.int64), values[::-1].astype(np.int64), out)
    pairs = kernel.pairs([int(x) for x in values[:4]])
    assert pairs is None or len(pairs[0]) == 2 * len(pairs[1])


if __name__ == "__main__":
    import atheris

    atheris.instrument_all()
    atheris.Setup(sys.argv, kernel_target)
    atheris.Fuzz()
