"""The operator's commands: triemask compile, inspect and cache."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import real_vocabulary
from triemask import Compiler, TrieAutomaton
from triemask.app.cli import main


def test_compile_inspect_and_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRIEMASK_CACHE", str(tmp_path / "cache"))
    values = tmp_path / "tools.txt"
    values.write_text("\ufeffget_user\r\ndelete_user\nget_users\n\nget_user\n", encoding="utf-8")
    out = tmp_path / "sets" / "tools.tm"
    main(["compile", str(values), "--vocab", "tiktoken:cl100k_base", "-o", str(out), "--layout", "lazy"])
    captured = capsys.readouterr()
    assert "[4/4] compiled and saved to" in captured.err and "duplicates collapsed: 1" in captured.out
    vocab = real_vocabulary("cl100k_base").vocab
    automaton = TrieAutomaton.load(out, vocab=vocab)
    assert sorted(automaton.values()) == ["delete_user", "get_user", "get_users"]
    expected = real_vocabulary("cl100k_base").encode("get_user")
    state = automaton.initial_state
    for token in expected:
        state = automaton.next_state(state, token)
    assert automaton.value_of(state) == "get_user"

    main(["inspect", str(out), "--json"])
    description = json.loads(capsys.readouterr().out)
    assert description["kind"] == "lazy" and description["vocab_fingerprint"] == vocab.fingerprint
    assert description["set_fingerprint"] == automaton.set_fingerprint and description["stats"]["values"] == 3
    main(["compile", str(values), "--vocab", "tiktoken:cl100k_base", "-o", str(tmp_path / "eager.tm")])
    capsys.readouterr()
    main(["inspect", str(tmp_path / "eager.tm"), "--vocab", "tiktoken:cl100k_base"])
    text = capsys.readouterr().out
    assert "allowed tokens by trie depth (paper, Table 15)" in text and "edge_tokens" in text

    main(["cache"])
    listing = capsys.readouterr().out
    assert f"token-index-{vocab.fingerprint}.tmi" in listing and "token_index" in listing
    main(["cache", "--clear"])
    assert "removed 1 files" in capsys.readouterr().out
    assert not list((tmp_path / "cache").glob("*.tmi"))
    assert np.array_equal(automaton.allowed_token_ids(0), TrieAutomaton.load(out, vocab=vocab).allowed_token_ids(0))


def test_bad_arguments_end_with_one_line(tmp_path: Path) -> None:
    values = tmp_path / "v.txt"
    values.write_text("a\n")
    for argv, message in [
        (["compile", str(values), "--vocab", "nope", "-o", str(tmp_path / "x.tm")], "no such file"),
        (["inspect", str(values)], "truncated"),
        (["inspect", str(tmp_path / "missing.tm")], "cannot read file"),
    ]:
        with pytest.raises(SystemExit) as raised:
            main(argv)
        assert message in str(raised.value)
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(SystemExit, match="holds no value"):
        main(["compile", str(tmp_path / "empty.txt"), "--vocab", "tiktoken:cl100k_base", "-o", str(tmp_path / "e.tm")])


def test_inspect_a_compiled_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("xgrammar")
    compiler = Compiler(real_vocabulary("cl100k_base").vocab, disk_cache=False)
    schema = {"type": "object", "properties": {"code": {"enum": [f"A{i:03d}" for i in range(300)]}}}
    path = tmp_path / "schema.tm"
    compiler.compile_json_schema(schema).save(path)
    main(["inspect", str(path), "--json"])
    description = json.loads(capsys.readouterr().out)
    assert description["kind"] == "schema"
    assert description["fields"] == [
        {"paths": ["$.properties.code.enum"], "values": 300, "nodes": description["fields"][0]["nodes"]}
    ]
    main(["inspect", str(path), "--vocab", "tiktoken:cl100k_base"])  # loads it with that vocabulary
    assert "enum field $.properties.code.enum: 300 values" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="compiled for the vocabulary with fingerprint"):
        main(["inspect", str(path), "--vocab", "tiktoken:o200k_base"])
