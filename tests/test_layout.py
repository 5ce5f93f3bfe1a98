"""The package's layout (docs/design.md, "Layers"): subpackages in layers, each importing only
from layers below it; no import cycle (function-level imports included); a subpackage used
only through its ``__init__``; adapters and applications on public names; no private name,
private module or private attribute across a subpackage line; one version."""

from __future__ import annotations

import ast
import importlib.metadata
from collections.abc import Iterator
from pathlib import Path

import triemask

SOURCE = Path(triemask.__file__).parent
# bottom to top; top-level modules form one layer above the subpackages
# the top-level modules an adapter or application may import from (besides the layers)
PUBLIC_MODULES = ("compiler", "matcher", "cache", "datasets", "hierarchy")
LAYERS = {"base": 0, "vocab": 1, "automata": 2, "sets": 3, "schemas": 4, "": 5, "integrations": 6, "app": 7}
SUBPACKAGES = ("base", "vocab", "automata", "sets", "schemas")
# imported inside functions because they need optional packages (torch, transformers, vLLM), or
# are the C extension itself
LAZY_TARGETS = (
    "triemask.integrations.transformers",
    "triemask.integrations.torch",
    "triemask.app",
    "triemask.base._native",
)


def _name(path: Path) -> str:
    parts = list(path.relative_to(SOURCE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(path: Path) -> str:
    return _name(path) if path.name == "__init__.py" else _name(path).rsplit(".", 1)[0]


def _imports(path: Path) -> Iterator[tuple[ast.stmt, str, list[str], bool]]:
    """Each import of a triemask module: (node, module, names, inside a function)."""
    tree = ast.parse(path.read_text())
    nested = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) for n in ast.walk(f) if n is not f}
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If)
        and "TYPE_CHECKING" in ast.unparse(node.test)
        and "KERNELS" not in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package(path).split(".")
                module = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.startswith("triemask"):
                yield node, module, [a.name for a in node.names], id(node) in nested
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("triemask"):
                    yield node, alias.name, [], id(node) in nested


def _is_module(name: str) -> bool:
    path = SOURCE.parent / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in SOURCE.rglob("*.py"):
        edges = graph.setdefault(_name(path), set())
        for _, module, names, _ in _imports(path):
            if names == ["_native"]:  # the C extension: a leaf
                continue
            targets = [f"{module}.{n}" for n in names if _is_module(f"{module}.{n}")] or [module]
            edges.update(t for t in targets if t != _name(path) and not t.endswith("._native"))
    return graph


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.get(parts[1], LAYERS[""]) if len(parts) > 2 or (parts[1:] and parts[1] in LAYERS) else LAYERS[""]


def test_the_import_graph_has_no_cycle() -> None:
    graph, done, stack = _graph(), set[str](), list[str]()

    def visit(module: str) -> None:
        if module in stack:
            raise AssertionError("import cycle: " + " -> ".join([*stack[stack.index(module) :], module]))
        if module in done:
            return
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            visit(target)
        stack.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


def test_layers_import_only_downwards() -> None:
    offenders = []
    for path in SOURCE.rglob("*.py"):
        here = _name(path)
        if here in ("triemask", "triemask.__main__"):  # the public re-exports; python -m triemask
            continue
        for _, module, _, _ in _imports(path):
            if module.startswith("triemask._version") or (
                here.split(".")[1] in ("app", "integrations")
                and (module == "triemask" or module.startswith("triemask.app"))
            ):
                continue
            if _layer(module) > _layer(here):
                offenders.append(f"{here} imports {module}")
    assert offenders == []


def test_no_function_level_imports_of_triemask_modules() -> None:
    offenders = [
        f"{_name(path)}: {module}"
        for path in SOURCE.rglob("*.py")
        for _, module, names, nested in _imports(path)
        if nested
        and not any(f"{module}.{n}".startswith(LAZY_TARGETS) or module.startswith(LAZY_TARGETS) for n in names or [""])
    ]
    assert offenders == []


def test_subpackages_are_used_through_their_init_and_public_names() -> None:
    offenders = []
    for path in SOURCE.rglob("*.py"):
        here = _name(path)
        for _, module, names, _ in _imports(path):
            parts = module.split(".")
            inside = here.split(".")[:2] == parts[:2]
            if len(parts) >= 2 and parts[1] in SUBPACKAGES and not inside:
                if len(parts) > 2:
                    offenders.append(f"{here} reaches into {module}")
                offenders += [f"{here} imports private {module}.{n}" for n in names if n.startswith("_")]
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private and (module, names) != ("triemask.base", ["_native"]):  # not even between siblings
                offenders.append(f"{here} imports {module}: {private}")
    assert offenders == []


def test_adapters_and_applications_use_public_names_only() -> None:
    offenders = []
    for folder in ("integrations", "app"):
        for path in (SOURCE / folder).rglob("*.py"):
            for _, module, names, _ in _imports(path):
                within = module.startswith(f"triemask.{folder}")
                public_layer = module in {f"triemask.{name}" for name in (*SUBPACKAGES, *PUBLIC_MODULES)} or (
                    module == "triemask" and set(names) <= set(PUBLIC_MODULES)
                )
                if within or module.startswith("triemask.integrations"):
                    continue
                if not public_layer or any(n.startswith("_") for n in names):
                    offenders.append(f"{_name(path)}: from {module} import {names}")
    assert offenders == []


def _private_attributes(paths: list[Path]) -> set[str]:
    """The private attributes a subpackage defines (assigned on self, class-level, methods)."""
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                found.add(node.attr)
            elif isinstance(node, ast.FunctionDef | ast.ClassDef):
                found.add(node.name)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("_"):
                found.add(node.value)  # __slots__
    return {name for name in found if name.startswith("_") and not name.startswith("__")}


def test_no_private_attribute_is_read_across_a_subpackage_line() -> None:
    owners = {
        name: _private_attributes(list((SOURCE / name).rglob("*.py"))) for name in (*SUBPACKAGES, "integrations", "app")
    }
    top = _private_attributes(list(SOURCE.glob("*.py")))
    offenders = []
    for path in SOURCE.rglob("*.py"):
        parts = path.relative_to(SOURCE).parts
        mine = owners.get(parts[0], top) if len(parts) > 1 else top
        others = set().union(*(v for k, v in owners.items() if len(parts) == 1 or k != parts[0]))
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr in others and node.attr not in mine:
                offenders.append(f"{path.relative_to(SOURCE)}:{node.lineno}: .{node.attr}")
    assert offenders == []


def test_the_top_level_shows_the_architecture() -> None:
    modules = {p.stem for p in SOURCE.glob("*.py")} - {"__init__", "__main__", "_version"}
    assert len(modules) <= 8, sorted(modules)
    too_long = {
        str(p.relative_to(SOURCE)): n for p in SOURCE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 900
    }
    assert too_long == {}


def test_integrations_hold_engine_adapters_only() -> None:
    adapters = {p.stem for p in (SOURCE / "integrations").glob("*.py")}
    assert adapters == {"__init__", "sglang", "torch", "transformers", "vllm"}
    assert {p.stem for p in (SOURCE / "integrations" / "serving").glob("*.py")} == {
        "__init__",
        "compiled_sets",
        "limits",
        "registry",
        "requests",
        "rows",
    }
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


def test_every_automaton_kind_implements_the_declared_interface() -> None:
    from conftest import byte_vocabulary
    from triemask import Compiler
    from triemask.automata import Automaton

    compiler = Compiler(byte_vocabulary(), disk_cache=False)
    trie = compiler.compile([f"v{i}" for i in range(100)])  # a change of 1%: merged at lookup
    kinds = [trie, compiler.compile(["a", "ab"], layout="lazy"), compiler.compile_format("date")]
    kinds.append(trie.with_values(added=["c"]))
    assert [type(k).__name__ for k in kinds] == [
        "TrieAutomaton",
        "LazyTrieAutomaton",
        "DagAutomaton",
        "UpdatedTrieAutomaton",
    ]
    assert all(isinstance(k, Automaton) for k in kinds)
