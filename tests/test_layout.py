"""The package's layout: library and application apart, no private names across modules,
one version, the lazily imported helpers visible to type checkers."""

from __future__ import annotations

import ast
import importlib.metadata
from pathlib import Path

import triemask

SOURCE = Path(triemask.__file__).parent
# private modules may be imported whole by their package; private *names* may not cross modules
PRIVATE_MODULES = {"_kernels", "_native", "_storage"}


def test_no_module_imports_another_modules_private_names() -> None:
    offenders = [
        f"{path.relative_to(SOURCE)}: from {'.' * node.level}{node.module} import {alias.name}"
        for path in sorted(SOURCE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("triemask"))
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__") and alias.name not in PRIVATE_MODULES
    ]
    assert offenders == []


def test_integrations_hold_engine_adapters_only() -> None:
    adapters = {p.stem for p in (SOURCE / "integrations").glob("*.py")}
    assert adapters == {"__init__", "_serving", "sglang", "torch", "transformers", "vllm"}
    application = {p.stem for p in (SOURCE / "app").glob("*.py")}
    assert {"cli", "demo", "evaluation", "model", "shared_prefix"} <= application
    allowed = {("__init__.py", "app.model"), ("__main__.py", "app.cli")}  # load_default_model; python -m triemask
    for path in SOURCE.rglob("*.py"):  # otherwise the library never imports the application
        if "app" in path.relative_to(SOURCE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and "app" in (node.module or "").split("."):
                assert (path.name, node.module) in allowed, path


def test_one_version() -> None:
    assert importlib.metadata.version("triemask") == triemask.__version__


# That triemask.choose, generate_json and load_default_model are visible to type checkers
# (imported on first use, they would otherwise type as `object`) is checked by mypy itself:
# `make typecheck` includes tests/typing_usage.py.
