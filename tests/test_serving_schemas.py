"""JSON schemas and tool lists through the serving core (vLLM V1 rows, Model Runner V2
slots), against the fakes of tests/test_serving.py: admission errors name the field,
every constrained output is a valid prefix of the schema, a finished one is valid."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import byte_vocabulary
from test_serving import FakeRequestStates, params
from triemask import Compiler, SchemaError, SchemaMatcher

torch = pytest.importorskip("torch")
pytest.importorskip("xgrammar")
from triemask.integrations.serving import (  # noqa: E402
    BatchRows,
    CompiledSets,
    Limits,
    RequestError,
    SlotStates,
    requested_schema,
    validate_request,
)

NAMES = ["get", "get_user", "get_users", "user", "🦙", *(f"tool_{i}" for i in range(300))]  # a trie by default
SCHEMA = {
    "type": "object",
    "properties": {"name": {"enum": NAMES}, "n": {"type": "integer"}},
    "required": ["name", "n"],
}
TOOLS = [
    {
        "name": "get_user",
        "parameters": {"type": "object", "properties": {"id": {"enum": ["a", "b"]}}, "required": ["id"]},
    },
    {
        "type": "function",
        "function": {
            "name": "get",
            "parameters": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
        },
    },
]


@pytest.fixture
def sets() -> CompiledSets:
    return CompiledSets(Compiler(byte_vocabulary()), torch.device("cpu"))


@pytest.mark.parametrize(
    ("extra_args", "message"),
    [
        ({"triemask_json_schema": 42}, "must be a JSON schema"),
        ({"triemask_json_schema": "{not json"}, "not valid JSON"),
        ({"triemask_json_schema": {"type": "object", "properties": {"k": {"enum": []}}}}, "at \\$.properties.k.enum"),
        ({"triemask_json_schema": SCHEMA, "triemask_values": ["a"]}, "not both"),
        ({"triemask_tools": [{"name": "a"}, {"name": "a"}]}, "at \\$\\[1\\].name"),
        ({"triemask_tools": {"name": "a"}}, "list of function specs"),
        (
            {"triemask_tools": [{"name": "a", "parameters": {"properties": {"x": {"enum": []}}}}]},
            "\\$\\[0\\].parameters.properties.x.enum",
        ),
    ],
)
def test_admission_names_the_field(extra_args: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(RequestError, match=message):
        validate_request(extra_args)


def test_deeply_nested_schemas_are_a_400() -> None:
    text = '{"a":' * 5_000 + "1" + "}" * 5_000
    nested: dict = {"type": "object"}  # type: ignore[type-arg]
    for _ in range(3_000):
        nested = {"type": "object", "properties": {"x": nested}}
    for given in (text, nested):
        with pytest.raises(RequestError, match="nested too deeply"):
            validate_request({"triemask_json_schema": given})
    with pytest.raises(RequestError, match="nested too deeply"):
        validate_request({"triemask_tools": [{"name": "a", "parameters": nested}]})


def test_schemas_deeper_than_the_bound_are_a_400_before_xgrammar_sees_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """240 nested objects (11 KB) cost xgrammar seconds; the bound is on the JSON's depth."""
    nested: dict = {"type": "string"}  # type: ignore[type-arg]
    for _ in range(240):
        nested = {"type": "object", "properties": {"x": nested}, "required": ["x"]}
    import xgrammar

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("xgrammar saw the schema")

    monkeypatch.setattr(xgrammar.Grammar, "from_json_schema", never)
    with pytest.raises(RequestError, match="nested too deeply: 481 levels, more than 128"):
        validate_request({"triemask_json_schema": nested})
    with pytest.raises(RequestError, match=r"\$\[0\].parameters.*481 levels"):
        validate_request({"triemask_tools": [{"name": "a", "parameters": nested}]})
    with pytest.raises(SchemaError, match="481 levels, more than 128"):
        Compiler(byte_vocabulary()).compile_json_schema(nested)


def test_a_schema_builds_at_most_a_few_pattern_automata(monkeypatch: pytest.MonkeyPatch) -> None:
    """Admission (on the front end's event loop) builds no pattern automaton; the compile
    builds MAX_DISPATCHED_PATTERNS of them at most (each bounded, about 0.15 s) and leaves the
    rest to xgrammar."""
    from triemask.schemas.reading import MAX_DISPATCHED_PATTERNS
    from triemask.sets import regex as _regex

    _regex.clear_pattern_cache()
    builds: list[str] = []
    build = _regex._dag_of_pattern
    monkeypatch.setattr(_regex, "_dag_of_pattern", lambda p: builds.append(p) or build(p))
    costly = {
        f"f{i}": {"type": "string", "pattern": f"\\w{{0,30}}\\d\\w{{0,30}}\\d\\w{{0,{30 + i}}}"} for i in range(20)
    }
    with pytest.raises(RequestError, match=r"about 9,0.. ms to compile, more than the server's limit of 2,000 ms"):
        validate_request({"triemask_json_schema": {"type": "object", "properties": costly}})
    with pytest.raises(RequestError, match=r"\$\[0\].parameters would take .* it holds 20 patterns"):  # per tool
        validate_request({"triemask_tools": [{"name": "a", "parameters": {"type": "object", "properties": costly}}]})
    requested_schema(
        {"triemask_json_schema": {"type": "object", "properties": costly}}, Limits(max_schema_cost_ms=20_000)
    )
    assert builds == []
    compiler = Compiler(byte_vocabulary())
    compiler.compile_json_schema({"type": "object", "properties": costly})
    assert len(builds) == MAX_DISPATCHED_PATTERNS
    finite = {f"f{i}": {"type": "string", "pattern": f"[a-c]{{{i + 1}}}"} for i in range(20)}  # all cheap
    compiled = compiler.compile_json_schema({"type": "object", "properties": finite})
    assert len(compiled.stats()["trie_fields"]) == MAX_DISPATCHED_PATTERNS


@pytest.mark.parametrize(
    ("properties", "required", "refused"),
    [
        (300, False, False),  # 0.5 s of xgrammar on Qwen: within the 2 s estimate
        (1000, False, True),  # 8.3 s: optional properties cost their square
        (1000, True, False),  # 0.1 s when they are required
    ],
)
def test_wide_objects_are_priced_by_their_optional_properties(properties: int, required: bool, refused: bool) -> None:
    fields = {f"field_{i}": {"type": "string"} for i in range(properties)}
    schema = {"type": "object", "properties": fields, **({"required": list(fields)} if required else {})}
    if refused:
        with pytest.raises(RequestError, match="optional properties cost 6,000 ms"):
            validate_request({"triemask_json_schema": schema})
    else:
        validate_request({"triemask_json_schema": schema})
    emails = {f"f{i}": {"type": "string", "format": "email"} for i in range(200)}  # 3.8 s on Qwen
    with pytest.raises(RequestError, match="200 formats"):
        validate_request({"triemask_json_schema": {"type": "object", "properties": emails, "required": list(emails)}})


def test_schema_size_is_limited() -> None:
    big = {"enum": [f"value_{i}" for i in range(2_000)]}
    with pytest.raises(RequestError, match="limit of 1000"):
        requested_schema({"triemask_json_schema": big}, Limits(max_values=10, max_value_bytes=10, max_set_bytes=1_000))
    request = requested_schema({"triemask_json_schema": json.dumps(SCHEMA)})
    assert request is not None and request == requested_schema({"triemask_json_schema": SCHEMA})  # one cache key
    # key order is kept: xgrammar emits properties in it (a request asking for "reasoning" before
    # "answer" gets them in that order)
    assert list(json.loads(request.text)["properties"]) == list(SCHEMA["properties"]) == ["name", "n"]
    reordered = requested_schema({"triemask_json_schema": json.dumps(SCHEMA, sort_keys=True)})
    assert reordered is not None and reordered != request


def _check(extra: dict, tokens: list[int], eos: int, sets: CompiledSets) -> None:  # type: ignore[type-arg]
    kind = "triemask_json_schema" if "triemask_json_schema" in extra else "triemask_tools"
    request = requested_schema(extra)
    assert request is not None
    matcher = SchemaMatcher(sets.get(request).schema)  # type: ignore[arg-type]
    for token in tokens:
        if token == eos:
            assert matcher.value is not None, (kind, matcher.text)
            return
        assert matcher.accept_token(token), (kind, matcher.text, token)


def test_v1_rows_mix_schemas_sets_and_free_requests(sets: CompiledSets) -> None:
    rows = BatchRows(sets)
    vocab = sets.compiler.vocab
    eos = vocab.eos_token_ids[0]
    rng = np.random.default_rng(3)
    kinds = [params(triemask_json_schema=SCHEMA), params(triemask_tools=TOOLS), params(triemask_values=NAMES), params()]
    outputs: list[list[int]] = [[] for _ in kinds]
    rows.update(SimpleNamespace(removed=[], added=[(i, p, [1], outputs[i]) for i, p in enumerate(kinds)], moved=[]))
    for _ in range(40):
        logits = torch.from_numpy(rng.standard_normal((len(kinds), vocab.vocab_size)).astype(np.float32))
        before = logits.clone()
        out = rows.apply(logits)
        assert torch.equal(out[3], before[3])  # the free request is untouched
        for i in range(len(kinds)):
            if not outputs[i] or outputs[i][-1] != eos:
                outputs[i].append(int(torch.argmax(out[i])))
        rows.update(None)
    _check(kinds[0].extra_args, outputs[0], eos, sets)
    _check(kinds[1].extra_args, outputs[1], eos, sets)


def test_v1_a_token_outside_the_schema_ends_the_row_alone(sets: CompiledSets, caplog) -> None:  # type: ignore[no-untyped-def]
    rows = BatchRows(sets)
    eos = sets.compiler.vocab.eos_token_ids[0]
    forced: list[int] = []
    rows.update(SimpleNamespace(removed=[], added=[(0, params(triemask_json_schema=SCHEMA), [1], forced)], moved=[]))
    forced.append(ord("x"))  # the engine forced a token the schema does not allow
    rows.update(None)
    out = rows.apply(torch.zeros(1, sets.compiler.vocab.vocab_size))
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [eos]
    assert "outside the JSON schema" in caplog.text


def test_v2_slots_follow_schema_requests(sets: CompiledSets) -> None:
    vocab = sets.compiler.vocab
    eos = vocab.eos_token_ids[0]
    req = FakeRequestStates(slots=3, max_len=64, vocab_size=vocab.vocab_size)
    slots = SlotStates(sets, req)
    requests = [params(triemask_json_schema=SCHEMA), params(triemask_tools=TOOLS), params(triemask_values=NAMES)]
    outputs: list[list[int]] = [[] for _ in requests]
    for slot, p in enumerate(requests):
        req.prompt_len.np[slot] = 1
        assert slots.add(slot, p)
    rng = np.random.default_rng(4)
    for _ in range(40):
        order = rng.permutation(3)
        ctx = SimpleNamespace(
            idx_mapping_np=order.astype(np.int32),
            input_ids=torch.tensor([outputs[s][-1] if outputs[s] else 9 for s in order]),
            seq_lens_upper_bound_np=np.array([1 + len(outputs[s]) for s in order]),
        )
        out = slots.apply(torch.from_numpy(rng.standard_normal((3, vocab.vocab_size)).astype(np.float32)), ctx)
        for row, slot in enumerate(order.tolist()):
            if not outputs[slot] or outputs[slot][-1] != eos:
                outputs[slot].append(int(torch.argmax(out[row])))
                req.all_token_ids.gpu[slot, len(outputs[slot])] = outputs[slot][-1]
    _check(requests[0].extra_args, outputs[0], eos, sets)
    _check(requests[1].extra_args, outputs[1], eos, sets)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("extra_columns", [0, 37])
def test_schema_rows_are_masked_exactly_through_the_bitmask(sets: CompiledSets, dtype, extra_columns: int) -> None:  # type: ignore[no-untyped-def]
    """mask_schema_rows writes -inf exactly outside each row's allowed tokens, in the rows it is
    given only, whatever the logits' dtype (xgrammar's kernel, or booleans where it refuses one)
    and width (columns past the vocabulary closed); an ended row allows EOS alone."""
    from triemask.integrations.serving import mask_schema_rows

    vocab = sets.compiler.vocab
    eos = vocab.eos_token_ids[0]
    live = SchemaMatcher(sets.get(requested_schema({"triemask_json_schema": SCHEMA})).schema)  # type: ignore[arg-type]
    live.accept_tokens(list(b'{"name": "get'))
    done = SchemaMatcher(live.schema)
    done.accept_tokens([*b'{"name": "get", "n": 1}', eos])
    width = vocab.vocab_size + extra_columns
    logits = torch.zeros(4, width, dtype=dtype)
    mask_schema_rows(logits, {1: live, 3: done})
    finite = [set(torch.isfinite(logits[i]).nonzero().flatten().tolist()) for i in range(4)]
    assert finite[0] == finite[2] == set(range(width))  # rows not given: untouched
    assert finite[1] == set(live.allowed_token_ids().tolist()) and max(finite[1]) < vocab.vocab_size
    assert finite[3] == {eos}


def test_a_union_is_priced_by_its_structure_and_costliest_branch() -> None:
    """A tool-call union compiles its structure and one branch at a time (each choice), so
    admission prices that, not every branch at once: 500 tools with a pattern each pass. With
    one tool whose arguments cost more than a choice may (MAX_CHOICE_COMPILE_MS), the union
    stays xgrammar's, priced whole, and is refused."""

    def tool(i: int, patterns: int) -> dict[str, object]:
        arguments = {
            f"p{j}": {"type": "string", "pattern": f"\\w{{0,{30 + i}}}\\d{{{j + 1}}}"} for j in range(patterns)
        }
        return {
            "properties": {"name": {"type": "string", "enum": [f"tool_{i}"]}, "parameters": {"properties": arguments}},
            "required": ["name", "parameters"],
        }

    def union(tools: list[dict[str, object]]) -> dict[str, object]:
        return {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": tools}}

    requested_schema({"triemask_json_schema": union([tool(i, 1) for i in range(500)])}, Limits())  # 225 s at once
    with pytest.raises(RequestError, match=r"about 227,... ms to compile.* it holds 505 patterns"):
        requested_schema({"triemask_json_schema": union([tool(i, 1) for i in range(499)] + [tool(499, 6)])}, Limits())
