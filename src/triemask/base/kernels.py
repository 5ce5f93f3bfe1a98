"""Which implementation of the hot loops is in use: the C extension or the NumPy code.

The NumPy code is the reference; ``triemask.base._native`` (src/triemask/base/_native.c, built from base/csrc/) runs the
same loops when it was built (``pip install .`` with a C compiler) and ``TRIEMASK_NATIVE``
is not ``0``. Callers read ``KERNELS`` at call time, so that tests can switch it off.
"""

from __future__ import annotations

import os
from types import ModuleType

__all__ = ["KERNELS", "NATIVE"]

KERNELS: ModuleType | None = None
if os.environ.get("TRIEMASK_NATIVE", "1") != "0":
    try:
        from . import _native as KERNELS
    except ImportError:  # built without a C compiler
        KERNELS = None

if KERNELS is not None:
    import numpy as np

    # Let Kernel.fill read numpy arrays' headers instead of the buffer protocol (half the
    # per-step cost); the C side checks its view of the header on these probes first.
    _probe = np.arange(12, dtype=np.int32).reshape(3, 4)
    _frozen = _probe.copy()
    _frozen.flags.writeable = False
    KERNELS.enable_ndarray_headers(_probe, _frozen, _probe.T)

NATIVE = KERNELS is not None
"""Whether the C extension is in use. Results are identical either way; only speed differs."""
