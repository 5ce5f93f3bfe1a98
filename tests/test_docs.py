"""The README quickstart and the docstring examples run as written."""

from __future__ import annotations

import doctest
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_readme_quickstart_runs() -> None:
    text = (ROOT / "README.md").read_text()
    assert text.lstrip().startswith("# triemask") and "make demo" in text.split("\n\n")[1]
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 2
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)


@pytest.mark.parametrize(
    "module",
    [
        "triemask",
        "triemask.vocab.vocabulary",
        "triemask.compiler",
        "triemask.matcher",
        "triemask.base.bitmask",
        "triemask.datasets",
    ],
)
def test_docstring_examples(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0 and result.attempted > 0


def test_cli_demo_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from triemask.app.cli import main

    main(["walk", "--values", "300", "--walks", "3"])
    out = capsys.readouterr().out
    assert "every decoded string is a member of the set" in out and "prefix sharing r =" in out
