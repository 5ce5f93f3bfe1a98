"""The serving-engine core (``triemask.integrations._serving``) against faithful fakes of
vLLM's interfaces: the V1 runner's ``BatchUpdate`` (removed, added with live output id
lists, moved / swapped) and Model Runner V2's ``req_states`` / ``LogitsContext`` (recycled
slots, reordered rows, preemption). The real vLLM runs in tests/test_vllm.py (marker vllm)."""

from __future__ import annotations

import enum
import logging
import warnings
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from conftest import byte_vocabulary
from triemask import FORMATS, Compiler, DagAutomaton, Vocabulary

torch = pytest.importorskip("torch")
from triemask.integrations import serving as _serving  # noqa: E402
from triemask.integrations.serving import (  # noqa: E402
    BatchRows,
    CompiledSets,
    Limits,
    PatternRequest,
    RequestError,
    SetCompileError,
    SlotStates,
    constrained_row,
    literal_alternatives,
    load_sets,
    requested_pattern,
    requested_values,
    validate_request,
)

VALUES = ["get", "get_user", "get_users", "user", "us", "🦙", "slack.send_message"]
OTHER = ["yes", "no"]


class Move(enum.Enum):  # vLLM's MoveDirectionality
    UNIDIRECTIONAL = enum.auto()
    SWAP = enum.auto()


@pytest.fixture
def sets() -> CompiledSets:
    return CompiledSets(Compiler(byte_vocabulary()), torch.device("cpu"))


@pytest.fixture
def registered(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    (tmp_path / "tools.txt").write_text("slack.send_message\ngithub.create_issue\n\n", encoding="utf-8")
    (tmp_path / "answers.txt").write_text("yes\nno\n", encoding="utf-8")
    monkeypatch.setenv(_serving.SETS_ENV, str(tmp_path))
    monkeypatch.setattr(_serving.registry, "_REGISTERED", None)
    return tmp_path


def params(**extra_args: object) -> SimpleNamespace:
    return SimpleNamespace(extra_args=extra_args or None)


def test_requests_name_their_set_or_list_it(registered) -> None:  # type: ignore[no-untyped-def]
    assert requested_values(None) is None and requested_values({"temperature_hint": 1}) is None
    assert requested_values({"triemask_values": ["a", "b"]}) == ["a", "b"]
    assert requested_values({"triemask_set": "tools"}) == ["slack.send_message", "github.create_issue"]
    assert load_sets(registered / "answers.txt") == {"answers": ["yes", "no"]}


@pytest.mark.parametrize(
    ("extra_args", "message"),
    [
        ({"triemask_values": "abc"}, "'triemask_values' must be a non-empty list of strings, got 'abc'"),
        ({"triemask_values": []}, "'triemask_values' must be a non-empty list of strings"),
        ({"triemask_values": ["a", 3]}, "item 1 is int 3"),
        ({"triemask_set": 7}, "'triemask_set' must be a set name"),
        ({"triemask_set": "nope"}, r"unknown set 'nope'$"),  # other sets' names are not told to the client
        ({"triemask_values": ["ok", "\ud800"]}, r"item 1 is not valid Unicode \(surrogates not allowed"),
        (
            {"triemask_values": ["a"] * 11},
            r"holds 11 values, more than the server's limit of 10 \(\$TRIEMASK_MAX_VALUES\)",
        ),
        ({"triemask_values": ["é" * 9]}, r"item 0 has 18 UTF-8 bytes, more than the server's limit of 16"),
        (
            {"triemask_values": ["abcdefgh"] * 5},
            r"limit of 32 UTF-8 bytes per set \(\$TRIEMASK_MAX_SET_BYTES\) at item 4",
        ),
        ({"triemask_set": "tools", "triemask_values": ["a"]}, "not both"),
    ],
)
def test_malformed_requests_name_the_field(registered, extra_args: dict, message: str, monkeypatch) -> None:  # type: ignore[no-untyped-def,type-arg]
    monkeypatch.setenv("TRIEMASK_MAX_VALUES", "10")
    monkeypatch.setenv("TRIEMASK_MAX_VALUE_BYTES", "16")
    monkeypatch.setenv("TRIEMASK_MAX_SET_BYTES", "32")
    with pytest.raises(RequestError, match=message):
        requested_values(extra_args)


@pytest.mark.parametrize(
    ("extra_args", "message"),
    [
        ({"triemask_format": "email"}, "'triemask_format': unknown format 'email'; the built-in formats are date"),
        ({"triemask_format": 3}, "'triemask_format' must be a string, got int 3"),
        ({"triemask_regex": "[0-9]+"}, r"'triemask_regex': '\+' repeats without bound.* at position 5"),
        ({"triemask_regex": "(ab"}, r"'triemask_regex': missing '\)' at position 0"),
        ({"triemask_regex": "a" * 40}, r"'triemask_regex' has 40 bytes, more than the server's limit of 32"),
        ({"triemask_regex": "a", "triemask_values": ["a"]}, "not both"),
    ],
)
def test_malformed_patterns_are_refused_at_admission(extra_args: dict, message: str, monkeypatch) -> None:  # type: ignore[no-untyped-def,type-arg]
    monkeypatch.setenv("TRIEMASK_MAX_PATTERN_BYTES", "32")
    with pytest.raises(RequestError, match=message):
        validate_request(extra_args)


def test_patterns_and_formats_compile_once_and_constrain_rows(sets: CompiledSets) -> None:
    assert requested_pattern({"triemask_format": "date"}) == PatternRequest("triemask_format", FORMATS["date"])
    assert requested_pattern({"triemask_values": ["a"]}) is None
    output: list[int] = []
    row = constrained_row(sets, {"triemask_regex": "[ab]{2}-?"}, output)
    assert row is not None and isinstance(row.compiled.automaton, DagAutomaton)
    assert sets.get(PatternRequest("triemask_regex", "[ab]{2}-?")) is row.compiled  # cached by pattern
    output.extend(b"ba-")  # the engine appends to its live list
    row.catch_up()
    automaton = row.compiled.automaton
    assert automaton.is_accepting(row.state) and automaton.spell(list(b"ba-")) == "ba-"


def test_costly_patterns_are_refused_before_parsing_or_within_the_automaton_budget(sets: CompiledSets) -> None:
    """A 1 MiB pattern is refused by its size before the parser sees it; a 9-byte pattern
    whose automaton would take gigabytes for the vocabulary (``.{0,1000}``) is admitted (its
    byte automaton is small) and refused by the engine's compile within the automaton budget,
    that request alone ended; a pattern whose byte automaton is costly is refused at
    admission, once."""
    with pytest.raises(RequestError, match="more than the server's limit of 4096"):
        validate_request({"triemask_regex": "a" * (1 << 20)})
    with pytest.raises(RequestError, match="steps to build"):
        validate_request({"triemask_regex": "((.{0,10}){0,10}){0,10}"})
    small = CompiledSets(sets.compiler, sets.device, limits=Limits(max_automaton_bytes=1 << 16))
    validate_request({"triemask_regex": ".{0,1000}"})
    with pytest.raises(SetCompileError, match=r"MemoryLimitError.*max_bytes=65,536"):
        small.get(PatternRequest("triemask_regex", ".{0,1000}"))
    with pytest.raises(SetCompileError, match="MemoryLimitError"):  # remembered as failed
        small.get(PatternRequest("triemask_regex", ".{0,1000}"))
    assert small.get(PatternRequest("triemask_regex", "[ab]{2}")).automaton is not None


def test_limits_come_from_the_environment_and_are_checked() -> None:
    assert Limits.from_env({}) == Limits()
    assert Limits.from_env({"TRIEMASK_MAX_VALUES": "5"}).max_values == 5
    for bad in ("ten", "0", "-3"):
        with pytest.raises(ValueError, match="TRIEMASK_MAX_SET_BYTES"):
            Limits.from_env({"TRIEMASK_MAX_SET_BYTES": bad})
    # the finding: 600,000 long values once reached the engine, stalled it and broke the key limit
    with pytest.raises(RequestError, match="holds 600000 values, more than the server's limit of 100000"):
        requested_values({"triemask_values": ["x" * 40] * 600_000}, Limits())


def test_set_files_are_regular_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A FIFO (which would block admission) or a link to /dev/zero (which never ends) named
    ``*.txt`` is refused, naming the file, before a byte is read."""
    import os

    (tmp_path / "good.txt").write_text("yes\nno\n", encoding="utf-8")
    os.mkfifo(tmp_path / "fifo.txt")
    with pytest.raises(ValueError, match=r"fifo.txt is not a regular file"):
        load_sets(tmp_path)
    (tmp_path / "fifo.txt").unlink()
    (tmp_path / "zero.txt").symlink_to("/dev/zero")
    with pytest.raises(ValueError, match=r"zero.txt is not a regular file"):
        load_sets(tmp_path)
    (tmp_path / "zero.txt").unlink()
    assert load_sets(tmp_path) == {"good": ["yes", "no"]}


def test_set_files_must_exist_and_hold_values(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="no such file or folder"):
        load_sets(tmp_path / "missing")
    with pytest.raises(ValueError, match=r"no \*\.txt file"):
        load_sets(tmp_path)
    (tmp_path / "empty.txt").write_text("\n", encoding="utf-8")
    with pytest.raises(ValueError, match="holds no value"):
        load_sets(tmp_path)


def test_set_files_are_strict_utf8_split_at_line_ends_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    odd = ["a\u2028b", "form\ffeed", "next\x85line", "tab\there", "crlf"]
    (tmp_path / "odd.txt").write_bytes(b"\xef\xbb\xbf" + "\n".join(odd[:-1]).encode() + b"\r\ncrlf\r\n")
    assert load_sets(tmp_path / "odd.txt") == {"odd": odd}  # BOM dropped, \r\n and \n only
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt is not UTF-8: byte 0xe9 at offset 3"):
        load_sets(tmp_path)


def test_registered_sets_are_read_once_and_a_failure_is_kept(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(_serving.SETS_ENV, str(tmp_path / "missing"))
    monkeypatch.setattr(_serving.registry, "_REGISTERED", None)
    for _ in range(2):
        with pytest.raises(ValueError, match="no such file or folder"):
            _serving.registered_sets()
    (tmp_path / "missing").mkdir()
    (tmp_path / "missing" / "yes.txt").write_text("yes\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no such file or folder"):  # kept, not read again
        _serving.registered_sets()
    with pytest.raises(RequestError, match="registered sets could not be loaded"):  # a 400, not a crash
        requested_values({"triemask_set": "yes"})


def test_registered_sets_compile_at_start_up_with_one_log_line(registered, sets, caplog) -> None:  # type: ignore[no-untyped-def]
    with caplog.at_level("INFO", logger="triemask"):
        _serving.compile_registered(sets)
    assert "2 registered sets (answers, tools; 4 values) compiled in" in caplog.text
    tiny = CompiledSets(sets.compiler, torch.device("cpu"), max_bytes=1)
    _serving.compile_registered(tiny)
    tiny.get(VALUES)
    tiny.get(OTHER)  # evicts unpinned sets only
    pinned = tiny.get(["slack.send_message", "github.create_issue"])
    assert tiny.get(["slack.send_message", "github.create_issue"]) is pinned


def test_registered_sets_that_do_not_compile_stop_the_start_up(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "bad.txt").write_text("ok\nnul\x00here\n", encoding="utf-8")
    monkeypatch.setenv(_serving.SETS_ENV, str(tmp_path))
    monkeypatch.setattr(_serving.registry, "_REGISTERED", None)
    vocab = Vocabulary([bytes([b]) for b in range(1, 256)] + [None], eos_token_ids=255)  # no NUL token
    with pytest.raises(ValueError, match="set 'bad' does not compile"):
        _serving.compile_registered(CompiledSets(Compiler(vocab), torch.device("cpu")))


@pytest.mark.parametrize(
    ("kind", "text", "values"),
    [
        ("regex", "yes|no", ["yes", "no"]),
        ("regex", "^(?:yes|no|maybe)$", ["yes", "no", "maybe"]),
        ("regex", r"(slack\.send_message|a\|b|caf\u00e9)", ["slack.send_message", "a|b", "café"]),
        ("regex", "[a-z]+", None),
        ("regex", "(a)|(b)", ["a", "b"]),  # groups are read as the patterns compiler reads them
        ("regex", "a(b|c)", None),
        ("regex", "[ab]", None),
        ("regex", r"a\d", None),
        ("regex", "colou?r", None),
        ("ebnf", 'root ::= "yes" | "no"', ["yes", "no"]),
        ("ebnf", 'root ::=\n  "a\\"b"\n| "\\u00e9"', ['a"b', "é"]),
        ("ebnf", 'root ::= "a" | b', None),
        ("ebnf", 'root ::= "a"\nb ::= "c"', None),
        ("ebnf", 'root ::= "a" |', None),
        ("json", '{"enum": ["a"]}', None),
    ],
)
def test_literal_alternations_are_recognised(kind: str, text: str, values: list[str] | None) -> None:
    assert literal_alternatives(kind, text) == values


def test_compiled_sets_are_shared_and_bounded_in_bytes(sets: CompiledSets) -> None:
    first = sets.get(VALUES)
    assert sets.get(list(VALUES)) is first and len(sets) == 1
    assert sets.get([*reversed(VALUES), VALUES[0]]) is first and len(sets) == 1  # the same set: one entry
    assert sets.get(["ab", "c"]) is not sets.get(["a", "bc"])  # value boundaries count
    small = CompiledSets(sets.compiler, torch.device("cpu"), max_bytes=first.nbytes + 1)
    a = small.get(VALUES)
    small.get(OTHER)  # evicts the least recently used
    assert len(small) == 1 and small.nbytes <= small.max_bytes
    assert small.get(VALUES) is not a  # compiled again
    assert small.cache.stats()["evictions"] >= 1


def _spelled(automaton, tokens: list[int]) -> str | None:  # type: ignore[no-untyped-def]
    state = automaton.initial_state
    for token in tokens:
        state = automaton.next_state(state, token)
    return automaton.value_of(state) if state >= 0 and automaton.is_final(state) else None


def test_v1_rows_follow_the_batch_through_adds_removes_moves_and_swaps(sets: CompiledSets) -> None:
    rows = BatchRows(sets)
    vocab = sets.compiler.vocab
    eos = vocab.eos_token_ids[0]
    rng = np.random.default_rng(0)
    # request id -> (extra args, output ids); the batch holds request ids by index
    requests = {r: (params(triemask_values=VALUES if r % 3 else OTHER) if r % 4 else params(), []) for r in range(12)}
    waiting = list(requests)
    batch: list[int | None] = [None] * 4
    finished: dict[int, list[int]] = {}
    steps = 0
    while (waiting or any(r is not None for r in batch)) and steps < 400:
        steps += 1
        removed, added, moved = [], [], []
        for index, r in enumerate(batch):
            if r is not None and (requests[r][1][-1:] == [eos] or len(requests[r][1]) >= 40):
                finished[r] = requests[r][1]
                batch[index] = None
                removed.append(index)
        for index in range(len(batch)):
            if batch[index] is None and waiting:
                r = waiting.pop(0)
                batch[index] = r
                added.append((index, requests[r][0], [1, 2], requests[r][1]))
        if rng.random() < 0.3:  # the engine condenses or reorders its persistent batch
            a, b = rng.choice(len(batch), 2, replace=False).tolist()
            if batch[a] is not None and batch[b] is None:  # condense: fill a hole
                batch[b], batch[a] = batch[a], None
                moved.append((a, b, Move.UNIDIRECTIONAL))
            else:
                batch[a], batch[b] = batch[b], batch[a]
                moved.append((a, b, Move.SWAP))
        rows.update(SimpleNamespace(batch_size=len(batch), removed=removed, added=added, moved=moved))
        logits = torch.from_numpy(rng.standard_normal((len(batch), vocab.vocab_size)).astype(np.float32))
        before = logits.clone()
        out = rows.apply(logits)
        for index, r in enumerate(batch):
            if r is None:
                continue
            if requests[r][0].extra_args is None:  # unconstrained rows are left alone
                assert torch.equal(out[index], before[index])
            token = int(torch.argmax(out[index]))
            requests[r][1].append(token)  # the engine appends to the live list
    assert len(finished) == 12
    for r, tokens in finished.items():
        extra = requests[r][0].extra_args
        if extra is not None:
            automaton = sets.get(extra["triemask_values"]).automaton
            assert _spelled(automaton, tokens) in extra["triemask_values"]


def test_v1_rows_with_async_placeholders_end_alone(sets: CompiledSets, caplog) -> None:  # type: ignore[no-untyped-def]
    rows = BatchRows(sets)
    output: list[int] = []
    fine: list[int] = []
    added = [(0, params(triemask_values=VALUES), [1], output), (1, params(triemask_values=OTHER), [1], fine)]
    rows.update(SimpleNamespace(removed=[], added=added, moved=[]))
    output.append(-1)
    fine.append(ord("y"))
    rows.update(None)  # no exception out of the engine step
    assert "52461" in caplog.text
    assert _only_eos(rows, sets, 0) and rows.rows[1].state != 0


def _only_eos(rows: BatchRows, sets: CompiledSets, index: int) -> bool:
    logits = torch.zeros(max(rows.rows) + 1, sets.compiler.vocab.vocab_size)
    rows.apply(logits)
    return torch.isfinite(logits[index]).nonzero().flatten().tolist() == list(sets.compiler.vocab.eos_token_ids)


def test_a_set_that_fails_to_compile_ends_its_request_alone(caplog) -> None:  # type: ignore[no-untyped-def]
    vocab = Vocabulary([bytes([b]) for b in range(1, 256)] + [None], eos_token_ids=255)  # no token spells NUL
    sets = CompiledSets(Compiler(vocab), torch.device("cpu"))
    rows = BatchRows(sets)
    bad = params(triemask_values=["ok", "nul\x00"])
    added = [(0, params(triemask_values=OTHER), [], []), (1, bad, [], []), (2, params(), [], [])]
    rows.update(SimpleNamespace(removed=[], added=added, moved=[]))  # all three are in, none raised
    assert sorted(rows.rows) == [0, 1] and "row 1 ended (only EOS allowed)" in caplog.text
    assert "cannot be spelled" in caplog.text and _only_eos(rows, sets, 1) and not _only_eos(rows, sets, 0)
    with pytest.raises(SetCompileError, match="cannot be spelled"):  # remembered: not compiled again
        sets.get(["ok", "nul\x00"])
    # Model Runner V2: the same request is admitted to an EOS-only slot
    slots = SlotStates(sets, FakeRequestStates(2, 8, vocab.vocab_size))
    assert slots.add(0, bad) and slots.add(1, params(triemask_values=OTHER))
    ctx = SimpleNamespace(idx_mapping_np=np.array([0, 1]), seq_lens_upper_bound_np=np.array([0, 0]), input_ids=None)
    out = slots.apply(torch.zeros(2, vocab.vocab_size), ctx)
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [255]
    assert sorted(torch.isfinite(out[1]).nonzero().flatten().tolist()) == [ord("n") - 1, ord("y") - 1]  # id = byte - 1


def test_a_set_that_runs_out_of_memory_ends_only_its_request(caplog, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A compile that fails in the engine (here: out of memory) ends its own request alone;
    the batch's other rows go on (the finding: a large set once raised out of the engine step)."""
    vocab = Vocabulary([bytes([b]) for b in range(256)] + [None], eos_token_ids=256)
    compiler = Compiler(vocab)
    rng = np.random.default_rng(0)
    large = ["".join(chr(c) for c in rng.integers(97, 123, 10)) for _ in range(10_000)]
    compile_values = Compiler.compile

    def compile_or_fail(self: Compiler, values: Any, **options: Any) -> Any:
        if len(values) == len(large):
            raise MemoryError("simulated: the set does not fit")
        return compile_values(self, values, **options)

    monkeypatch.setattr(Compiler, "compile", compile_or_fail)
    sets = CompiledSets(compiler, torch.device("cpu"))
    rows = BatchRows(sets)
    added = [(0, params(triemask_values=large), [], []), (1, params(triemask_values=OTHER), [], [])]
    rows.update(SimpleNamespace(removed=[], added=added, moved=[]))
    assert "MemoryError: simulated" in caplog.text and rows.rows[0].compiled is sets.ended()
    assert rows.rows[1].compiled is sets.get(OTHER)


def test_a_compile_that_raises_anything_ends_only_that_request(sets: CompiledSets, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def explode(values):  # type: ignore[no-untyped-def]
        if "boom" in values:
            raise MemoryError("no room")
        return original(values)

    original = sets._compile
    monkeypatch.setattr(sets, "_compile", explode)
    rows = BatchRows(sets)
    added = [(0, params(triemask_values=["boom"]), [], []), (1, params(triemask_values=OTHER), [], [])]
    rows.update(SimpleNamespace(removed=[], added=added, moved=[]))
    assert _only_eos(rows, sets, 0) and not _only_eos(rows, sets, 1)


class FakeRequestStates:
    """What Model Runner V2 hands a processor (``LogitsProcRequestState``)."""

    def __init__(self, slots: int, max_len: int, vocab_size: int) -> None:
        self.device = torch.device("cpu")
        self.max_num_reqs = slots
        self.vocab_size = vocab_size
        self.prompt_len = SimpleNamespace(np=np.zeros(slots, dtype=np.int32))
        self.all_token_ids = SimpleNamespace(gpu=torch.zeros((slots, max_len), dtype=torch.int32))
        self.total_len = SimpleNamespace(gpu=torch.zeros(slots, dtype=torch.int32))


def test_v2_slots_follow_recycled_slots_reordered_rows_and_preemption(sets: CompiledSets) -> None:
    vocab = sets.compiler.vocab
    eos = vocab.eos_token_ids[0]
    req = FakeRequestStates(slots=5, max_len=64, vocab_size=vocab.vocab_size)
    slots = SlotStates(sets, req)
    rng = np.random.default_rng(1)
    requests = {r: params(triemask_values=VALUES if r % 2 else OTHER) if r % 3 else params() for r in range(10)}
    outputs: dict[int, list[int]] = {r: [] for r in requests}
    slot_of: dict[int, int] = {}
    waiting, free, done = list(requests), list(range(5)), {}

    def admit(r: int) -> None:
        slot = free.pop(rng.integers(len(free)))
        slot_of[r] = slot
        prompt = [7, 8, 9][: 1 + r % 3]
        req.prompt_len.np[slot] = len(prompt)
        history = prompt + outputs[r]  # a resumed request brings its partial output
        req.all_token_ids.gpu[slot, : len(history)] = torch.tensor(history)
        assert slots.add(slot, requests[r]) == (requests[r].extra_args is not None)

    for _ in range(300):
        while waiting and free:
            admit(waiting.pop(0))
        slots.flush()
        if not slot_of:
            break
        active = list(slot_of)
        rng.shuffle(active)  # rows are reordered every step
        idx = np.array([slot_of[r] for r in active], dtype=np.int32)
        seq = np.array([req.prompt_len.np[slot_of[r]] + len(outputs[r]) for r in active])
        fed = [outputs[r][-1] if outputs[r] else 9 for r in active]
        ctx = SimpleNamespace(
            idx_mapping_np=idx,
            idx_mapping=torch.from_numpy(idx),
            expanded_idx_mapping=torch.from_numpy(idx),
            input_ids=torch.tensor(fed),
            seq_lens_upper_bound_np=seq,
        )
        logits = torch.from_numpy(rng.standard_normal((len(active), vocab.vocab_size)).astype(np.float32))
        before = logits.clone()
        out = slots.apply(logits, ctx)
        for row, r in enumerate(active):
            if requests[r].extra_args is None:
                assert torch.equal(out[row], before[row])
            token = int(torch.argmax(out[row]))
            outputs[r].append(token)
            slot = slot_of[r]
            req.all_token_ids.gpu[slot, req.prompt_len.np[slot] + len(outputs[r]) - 1] = token
            if token == eos or len(outputs[r]) >= 40:
                done[r] = outputs[r]
                free.append(slot_of.pop(r))
            elif rng.random() < 0.05:  # preempted: back to the queue, resumed later in any slot
                free.append(slot_of.pop(r))
                waiting.append(r)
    assert len(done) == 10
    for r, tokens in done.items():
        extra = requests[r].extra_args
        if extra is not None:
            assert _spelled(sets.get(extra["triemask_values"]).automaton, tokens) in extra["triemask_values"]


def test_v2_slots_refuse_speculative_rows(sets: CompiledSets) -> None:
    slots = SlotStates(sets, FakeRequestStates(2, 8, sets.compiler.vocab.vocab_size))
    ctx = SimpleNamespace(idx_mapping_np=np.array([0]), seq_lens_upper_bound_np=np.array([1]), input_ids=None)
    with pytest.raises(RuntimeError, match="speculative decoding"):
        slots.apply(torch.zeros(2, sets.compiler.vocab.vocab_size), ctx)


def test_a_registered_set_is_updated_by_name_without_a_restart(registered, sets, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    """Editing a set's file is seen by the next request after RELOAD_SECONDS: the name gives the
    new values, the new set is pinned when first compiled, the old one unpinned; an edit that
    cannot be read keeps the previous sets."""
    monkeypatch.setattr(_serving.registry, "RELOAD_SECONDS", 0.0)
    monkeypatch.setattr(_serving.registry, "_REGISTERED_STATE", {"signature": None, "checked": 0.0, "generation": 0})
    _serving.compile_registered(sets)
    old = requested_values({"triemask_set": "tools"})
    assert old == ["slack.send_message", "github.create_issue"]
    pinned_old = sets.get(old)
    (registered / "tools.txt").write_text("slack.send_message\njira.close_ticket\n", encoding="utf-8")
    import os

    os.utime(registered / "tools.txt", ns=(1, 10**18))  # a modification time that surely differs
    with caplog.at_level("INFO", logger="triemask"):
        new = requested_values({"triemask_set": "tools"})
    assert new == ["slack.send_message", "jira.close_ticket"] and "registered sets reloaded" in caplog.text
    assert _serving.registered_generation() == 1
    compiled = sets.get(new)
    assert compiled.automaton is not None and sorted(compiled.automaton.values()) == sorted(new)
    assert sets.get(list(reversed(new))) is compiled  # pinned, and the same set in any order
    assert sets.get(old) is not pinned_old  # the old set is no longer pinned: compiled again if asked
    (registered / "tools.txt").write_bytes(b"\xff\xfe broken\n")
    os.utime(registered / "tools.txt", ns=(1, 2 * 10**18))
    with caplog.at_level("WARNING", logger="triemask"):
        assert requested_values({"triemask_set": "tools"}) == new  # the previous sets stay
    assert "not reloaded, the previous ones stay" in caplog.text


def test_schemas_with_unenforced_keywords_are_served_and_logged(
    sets: CompiledSets, caplog: pytest.LogCaptureFixture
) -> None:
    """The standard engine serves a schema with keywords xgrammar does not enforce; so does
    triemask's (admitted, compiled as xgrammar compiles it, one log line naming them)."""
    schema = {"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True, "not": {"maxItems": 0}}
    request = _serving.requested_schema({_serving.SCHEMA_ARG: schema})
    assert request is not None
    with caplog.at_level(logging.WARNING, logger="triemask"), warnings.catch_warnings():
        warnings.simplefilter("error")  # a log line, not a Python warning
        compiled = sets.get(request).schema
    assert compiled is not None and compiled.unenforced == ("$.uniqueItems", "$.not")
    assert "does not enforce: $.uniqueItems, $.not" in caplog.text
    # a tool's arguments compile in the engine's step: what they do not enforce is logged at
    # admission, once for a tool list seen again, and the compile warns nowhere
    tools = [{"name": "tag", "parameters": {"type": "object", "properties": {"t": {"not": {"const": 1}}}}}]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="triemask"), warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            tool_request = _serving.requested_schema({_serving.TOOLS_ARG: tools})
            assert tool_request is not None
        served = sets.get(tool_request).schema
        assert served is not None
        assert served.arguments_schema("tag").unenforced == ("$.properties.arguments.properties.t.not",)
    assert caplog.text.count("$[0].parameters.properties.t.not") == 1


def test_a_small_change_to_a_registered_set_updates_it_in_place(registered, sets, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A registered set edited by a few values is updated from its pinned automaton
    (``with_values``), not recompiled: pinned under its new values, masked from the host's
    lookups (its states are pairs), and decoded to members of the new set by the V1 rows and
    the V2 slots alike."""
    import os

    from triemask.integrations.torch import HostPlannedAutomaton

    monkeypatch.setattr(_serving.registry, "RELOAD_SECONDS", 0.0)
    monkeypatch.setattr(_serving.registry, "_REGISTERED_STATE", {"signature": None, "checked": 0.0, "generation": 0})
    tools = [f"team{i}.tool_{i * 7}" for i in range(300)]
    (registered / "tools.txt").write_text("\n".join(tools) + "\n", encoding="utf-8")
    _serving.compile_registered(sets)
    new = [*tools[2:], "team9.fresh_tool"]
    (registered / "tools.txt").write_text("\n".join(new) + "\n", encoding="utf-8")
    os.utime(registered / "tools.txt", ns=(1, 10**18))
    assert requested_values({"triemask_set": "tools"}) == new
    compiled = sets.get(new)
    assert compiled.automaton is not None and compiled.automaton.stats()["layout"] == "updated"
    assert isinstance(compiled.device_automaton, HostPlannedAutomaton)
    assert sets.get(list(reversed(new))) is compiled  # pinned
    assert compiled.automaton.values() == sorted(new)
    vocab = sets.compiler.vocab
    eos = vocab.eos_token_ids[0]
    rng = np.random.default_rng(3)
    # V1: a row per request, its state on the host
    outputs: list[list[int]] = [[] for _ in range(4)]
    rows = BatchRows(sets)
    rows.update(
        SimpleNamespace(
            removed=[], added=[(i, params(triemask_set="tools"), [], outputs[i]) for i in range(4)], moved=[]
        )
    )
    for _ in range(40):
        logits = torch.from_numpy(rng.standard_normal((4, vocab.vocab_size)).astype(np.float32))
        rows.apply(logits)
        for i in range(4):
            if not outputs[i] or outputs[i][-1] != eos:
                outputs[i].append(int(torch.argmax(logits[i])))
        rows.update(None)
    for tokens in outputs:
        assert tokens[-1] == eos and _spelled(compiled.automaton, tokens) in set(new)
    # V2: the slot's state starts at the updated set's initial state (a pair, not node 0)
    req = FakeRequestStates(slots=2, max_len=64, vocab_size=vocab.vocab_size)
    slots = SlotStates(sets, req)
    assert slots.add(1, params(triemask_set="tools"))
    output: list[int] = []
    for _ in range(40):
        ctx = SimpleNamespace(
            idx_mapping_np=np.array([1], dtype=np.int32),
            input_ids=torch.tensor([output[-1] if output else 9]),
            seq_lens_upper_bound_np=np.array([len(output)]),
        )
        logits = slots.apply(torch.from_numpy(rng.standard_normal((1, vocab.vocab_size)).astype(np.float32)), ctx)
        output.append(int(torch.argmax(logits[0])))
        req.all_token_ids.gpu[1, len(output) - 1] = output[-1]
        if output[-1] == eos:
            break
    assert output[-1] == eos and _spelled(compiled.automaton, output) in set(new)
