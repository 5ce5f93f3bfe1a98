"""The C extension (triemask.base._native, a unity of base/csrc/*.c): built with the system compiler by ``pip install .``.

Everything else is in pyproject.toml. The extension is optional: without a C compiler the
install still succeeds and triemask runs its NumPy reference code (``triemask.native``
tells which is in use).
"""

import glob
import os
import sys

from setuptools import Extension, setup

flags = [] if sys.platform == "win32" else ["-O3", "-std=c99", "-Wall", "-Wextra", "-Wno-unused-parameter"]
flags += os.environ.get("TRIEMASK_CFLAGS", "").split()  # make test-asan adds the sanitizers here

setup(
    ext_modules=[
        Extension(
            "triemask.base._native",
            ["src/triemask/base/_native.c"],
            depends=sorted(glob.glob("src/triemask/base/csrc/*.c")),
            extra_compile_args=flags,
            extra_link_args=os.environ.get("TRIEMASK_LDFLAGS", "").split(),
            optional=os.environ.get("TRIEMASK_REQUIRE_NATIVE") != "1",
        )
    ]
)
