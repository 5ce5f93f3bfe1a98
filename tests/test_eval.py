"""``triemask eval`` and ``triemask demo``: answer matching, sampling, the tool catalogue,
shared-prefix generation, and a whole evaluation on a tiny random model."""

from __future__ import annotations

import collections

import pytest

from conftest import byte_level_tokenizer, tiny_causal_lm
from triemask import datasets
from triemask.app.evaluation import Settings, answer_line, match_label, stratified_sample, tool_request
from triemask.datasets import tool_catalogue

LABELS = ["LOC:city", "LOC:other", "HUM:ind", "NUM:date", "no", "yes"]


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("LOC:city", ("LOC:city", True)),
        ("  `LOC:city`.\nbecause ...", ("LOC:city", True)),
        ('"yes"', ("yes", True)),
        ("The answer is LOC:other, a place.", ("LOC:other", False)),
        ("I think HUM:ind or maybe HUM:individual", ("HUM:ind", False)),
        ("LOC:cty", ("LOC:city", False)),  # closest by difflib ratio
        ("nothing that resembles a label at all", (None, False)),
        ("", (None, False)),
        ("nobody knows", (None, False)),  # "no" inside a word is not the label "no"
    ],
)
def test_unconstrained_answers_are_matched_to_the_set(output: str, expected: tuple[str | None, bool]) -> None:
    assert match_label(output, LABELS) == expected


def test_the_answer_line_is_the_first_non_empty_line() -> None:
    assert answer_line("\n\n  **NUM:date**  \nmore") == "NUM:date"
    assert answer_line("   \n") == ""


def test_stratified_samples_spread_over_labels_and_are_reproducible() -> None:
    rows = [{"text": f"{label} {i}", "label": label} for label in "abcde" for i in range(10 if label == "a" else 3)]
    sample = stratified_sample(rows, 10, seed=1)
    counts = collections.Counter(row["label"] for row in sample)
    assert len(sample) == 10 and set(counts) == set("abcde") and max(counts.values()) == 2
    assert sample == stratified_sample(rows, 10, seed=1) and sample != stratified_sample(rows, 10, seed=2)
    assert stratified_sample(rows, None, seed=0) == rows and stratified_sample(rows, 999, seed=0) == rows
    few = stratified_sample(rows, 20, seed=0)  # label "a" supplies the rows the others lack
    assert len(few) == 20 and len({row["text"] for row in few}) == 20


def test_tool_catalogues_hold_exactly_k_names() -> None:
    for k in (200, 500, 1_000, 5_000):
        names, namespaces, _, _ = tool_catalogue(k)
        assert len(names) == len(set(names)) == k
        assert len(namespaces) == k // 100 - 1 and namespaces[:1] == ["slack"]
        assert all(name.split(".")[0] in namespaces for name in names if "." in name)
    assert tool_request("github.delete_repository") == "Delete the repository in GitHub."
    assert tool_request("upload_invoice") == "Upload an invoice."
    for bad in (150, 100, 10_100):
        with pytest.raises(ValueError, match=f"got {bad}"):
            tool_catalogue(bad)


def test_settings_name_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="'imdb'"):
        Settings(datasets=["imdb"])
    with pytest.raises(ValueError, match="per_k must be at least 1, got 0"):
        Settings(per_k=0)
    with pytest.raises(ValueError, match="got 450"):
        Settings(tool_k=[450])
    with pytest.raises(ValueError, match="per_dataset must be at least 1, got 0"):
        Settings(per_dataset=0)
    with pytest.raises(ValueError, match="per_k=300 exceeds the smallest tool set"):
        Settings(tool_k=[200], per_k=300)


def test_bundled_test_sets_use_their_label_sets() -> None:
    for name in datasets.LABEL_SETS:
        rows = datasets.load_test_set(name)
        assert rows and {row["label"] for row in rows} <= set(datasets.load_labels(name))
    assert [len(datasets.load_test_set(n)) for n in datasets.LABEL_SETS] == [500, 2_974, 3_080, 4_500]
    with pytest.raises(ValueError, match="'sst2'"):
        datasets.load_test_set("sst2")
    assert datasets.load_tool_registry() == datasets.synthetic_tools(10_000, seed=0)
    assert datasets.load_icd10cm_descriptions()["E11.9"] == "Type 2 diabetes mellitus without complications"


torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_a_shared_prefix_cache_changes_nothing_but_the_work() -> None:
    from triemask.app.shared_prefix import SharedPrefixGenerator
    from triemask.integrations.transformers import compiler_for

    tokenizer = byte_level_tokenizer()
    model = tiny_causal_lm(len(tokenizer), 3)  # type: ignore[arg-type]
    prefix = "Select exactly one of the following options: get, get_user, is.\n\nText:"
    prompts = [prefix + " get a user", prefix + " is it?", "Unrelated prompt"]  # the last shares nothing
    automaton = compiler_for(model, tokenizer).compile(["get", "get_user", "is"])
    cached, plain = SharedPrefixGenerator(model, tokenizer, prefix), SharedPrefixGenerator(model, tokenizer, "")
    for prompt in prompts:
        for constraint in (None, automaton):
            one = cached.generate(prompt, automaton=constraint, max_new_tokens=9)
            other = plain.generate(prompt, automaton=constraint, max_new_tokens=9)
            assert one.tokens == other.tokens
        assert one.mask_steps == len(one.tokens) and one.mask_seconds > 0
    first_line = plain.generate(prompts[0], automaton=None, max_new_tokens=40, first_line=True)
    assert "\n" not in first_line.text.strip()


def test_a_whole_evaluation_on_a_tiny_model_keeps_every_constrained_answer_valid() -> None:
    from triemask.app.evaluation import METHODS, evaluate, plot, to_markdown

    tokenizer = byte_level_tokenizer()
    model = tiny_causal_lm(len(tokenizer), 0)  # type: ignore[arg-type]
    settings = Settings(datasets=["trec", "banking77"], per_dataset=3, tool_k=[200], per_k=3, think_tokens=4)
    seen = []

    def steps(description: str, total: int):  # type: ignore[no-untyped-def]
        seen.append(description)
        yield from range(total)

    results = evaluate(model, tokenizer, settings, steps)
    assert seen == ["trec (K=42)", "banking77 (K=77)", "tools (K=200)"]
    for name in ("trec", "banking77"):
        table = results["table6"][name]
        assert table["sample"] == 3 and set(table["methods"]) == set(METHODS)
        assert table["methods"]["PE + trie"]["validity"] == table["methods"]["think + trie"]["validity"] == 100
        labels = set(datasets.load_labels(name))
        for example in table["examples"]:
            assert example["outcomes"]["PE + trie"]["prediction"] in labels and "thinking" in example
    assert results["table16"]["200"]["methods"]["trie"]["validity"] == 100
    for table in (results["table6"]["trec"], results["table16"]["200"]):
        jump = table["jump_forward"]
        assert jump["answers"] == jump["same_answers"] == 3  # (verified drafts: the plain loop's answers)
        assert 1 <= jump["passes_jump"] <= jump["passes_plain"]
    report = to_markdown(results)
    assert "| trec | 42 | 3 of 500 |" in report and "| 200 | 3 |" in report
    assert "| tools 200 | 200 | 3 |" in report
    pytest.importorskip("matplotlib")
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        plot(results, f"{folder}/eval.png")


@pytest.mark.model
def test_the_demo_answers_every_question_with_a_member(capsys: pytest.CaptureFixture[str]) -> None:
    from triemask.app.demo import demo

    demo(limit=None)
    out = capsys.readouterr().out
    assert "valid answers: triemask 8/8" in out and "compiled 74,719 ICD-10-CM codes" in out
    flowing = " ".join(out.split())  # (rich wraps lines at the console's width)
    assert "tool calls with jump-forward" in flowing and "forward passes per call" in flowing


def test_demo_and_eval_say_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from triemask.app.cli import main

    monkeypatch.setitem(sys.modules, "rich", None)  # as if the [demo] extra were missing
    for command in (["demo"], ["eval", "--per-dataset", "1"]):
        with pytest.raises(
            SystemExit, match=r"needs the \[demo\] extra .*pip install torch==2.13.0 'triemask\[demo\]'"
        ):
            main(command)
