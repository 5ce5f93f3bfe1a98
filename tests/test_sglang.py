"""SGLang adapters against faithful fakes of SGLang 0.5.23's interfaces (SGLang itself
needs CUDA kernels and does not install on this CPU-only machine).

The fakes reproduce what the adapters touch: ``CustomLogitProcessor`` (re-instantiated
for every batch, rows' ``custom_params`` carrying ``"__req__"`` with ``rid``,
``output_ids``, ``tokenizer``, ``vocab_size``, ``eos_token_ids``), ``BaseGrammarObject`` /
``BaseGrammarBackend`` (allocate / fill / move / apply of xgrammar-layout bitmasks,
accept_token, is_terminated) and the plugin registry (``register_grammar_backend``,
``add_grammar_backend_choices``).
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import json
import re
import sys
import types
from array import array
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from conftest import byte_level_tokenizer
from triemask import FORMATS

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

VALUES = ["get", "get_user", "get_users", "user", "us", "Paris", "slack.send_message"]


class _CustomLogitProcessor(abc.ABC):
    @abc.abstractmethod
    def __call__(self, logits, custom_param_list=None): ...  # type: ignore[no-untyped-def]


class _BaseGrammarObject:
    def __init__(self) -> None:
        self._finished = False
        self.grammar_stats = None
        self.current_token = None


_INVALID_GRAMMAR = _BaseGrammarObject()


class _BaseGrammarBackend:
    def __init__(self) -> None:
        self.cache: dict = {}  # type: ignore[type-arg]


class _XGrammarBackend:
    def __init__(self, tokenizer, vocab_size, model_eos_token_ids=None):  # type: ignore[no-untyped-def]
        self.calls: list[tuple[str, str]] = []

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        if not name.startswith("dispatch_"):
            raise AttributeError(name)
        return lambda text: self.calls.append((name, text)) or ("xgrammar", name, text)


@pytest.fixture
def sglang(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    registry: dict = {}  # type: ignore[type-arg]
    choices = ["xgrammar", "outlines", "llguidance", "none"]
    modules = {
        "sglang": types.ModuleType("sglang"),
        "sglang.srt": types.ModuleType("sglang.srt"),
        "sglang.srt.sampling": types.ModuleType("sglang.srt.sampling"),
        "sglang.srt.sampling.custom_logit_processor": types.ModuleType("custom_logit_processor"),
        "sglang.srt.constrained": types.ModuleType("sglang.srt.constrained"),
        "sglang.srt.constrained.base_grammar_backend": types.ModuleType("base_grammar_backend"),
        "sglang.srt.constrained.xgrammar_backend": types.ModuleType("xgrammar_backend"),
        "sglang.srt.server_args": types.ModuleType("server_args"),
    }
    modules["sglang.srt.sampling.custom_logit_processor"].CustomLogitProcessor = _CustomLogitProcessor  # type: ignore[attr-defined]
    base = modules["sglang.srt.constrained.base_grammar_backend"]
    base.BaseGrammarObject = _BaseGrammarObject  # type: ignore[attr-defined]
    base.BaseGrammarBackend = _BaseGrammarBackend  # type: ignore[attr-defined]
    base.GRAMMAR_BACKEND_REGISTRY = registry  # type: ignore[attr-defined]
    base.INVALID_GRAMMAR_OBJ = _INVALID_GRAMMAR  # type: ignore[attr-defined]
    base.register_grammar_backend = registry.__setitem__  # type: ignore[attr-defined]
    modules["sglang.srt.constrained.xgrammar_backend"].XGrammarGrammarBackend = _XGrammarBackend  # type: ignore[attr-defined]
    modules["sglang.srt.server_args"].GRAMMAR_BACKEND_CHOICES = choices  # type: ignore[attr-defined]
    modules["sglang.srt.server_args"].add_grammar_backend_choices = choices.extend  # type: ignore[attr-defined]
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delitem(sys.modules, "triemask.integrations.sglang", raising=False)
    adapter = importlib.import_module("triemask.integrations.sglang")
    yield SimpleNamespace(adapter=adapter, registry=registry, choices=choices)
    sys.modules.pop("triemask.integrations.sglang", None)


def _request(rid: str, tokenizer: object) -> SimpleNamespace:
    request = SimpleNamespace(
        rid=rid,
        output_ids=array("q"),
        tokenizer=tokenizer,
        vocab_size=300,
        eos_token_ids={tokenizer.eos_token_id},  # type: ignore[attr-defined]
        aborted=None,
    )
    request.set_finish_with_abort = lambda message: setattr(request, "aborted", message)  # as Req does
    return request


def _spelled(tokenizer: object, ids: list[int]) -> str:
    return str(tokenizer.decode([i for i in ids if i != tokenizer.eos_token_id]))  # type: ignore[attr-defined]


def test_custom_logit_processor_keeps_each_request_in_its_set(sglang) -> None:  # type: ignore[no-untyped-def]
    tokenizer = byte_level_tokenizer()
    eos = tokenizer.eos_token_id  # type: ignore[attr-defined]
    rng = np.random.default_rng(0)
    requests = [_request(f"r{i}", tokenizer) for i in range(8)]
    params: list[dict | None] = [  # type: ignore[type-arg]
        {"triemask_values": VALUES} if i % 3 == 0 else {"triemask_values": ["yes", "no"]} if i % 3 == 1 else None
        for i in range(6)
    ]
    params += [{"triemask_format": "ipv4"}, {"triemask_regex": "[a-c]{2}-[0-9]"}]
    for step in range(40):
        live = [i for i, r in enumerate(requests) if not (r.output_ids and r.output_ids[-1] == eos)]
        if not live:
            break
        batch = [None if params[i] is None else {**params[i], "__req__": requests[i]} for i in live]
        logits = torch.from_numpy(rng.standard_normal((len(live), 300)).astype(np.float32))
        before = logits.clone()
        out = sglang.adapter.TriemaskLogitProcessor()(logits, batch)  # a new instance per batch
        for row, i in enumerate(live):
            if params[i] is None:
                assert torch.equal(out[row], before[row])
            requests[i].output_ids.append(int(torch.argmax(out[row])) if params[i] or step < 39 else eos)
    for i, request in enumerate(requests):
        if params[i] is not None:
            assert request.output_ids[-1] == eos
            text = _spelled(tokenizer, list(request.output_ids))
            if "triemask_values" in params[i]:
                assert text in params[i]["triemask_values"]
            else:
                assert re.fullmatch(FORMATS["ipv4"] if "triemask_format" in params[i] else "[a-c]{2}-[0-9]", text)


@pytest.mark.parametrize(
    ("custom_params", "reason"),
    [
        ({"triemask_values": "yes"}, "'triemask_values' must be a non-empty list of strings"),
        ({"triemask_values": []}, "'triemask_values' must be a non-empty list"),
        ({"triemask_set": "nope"}, "unknown set 'nope'"),
        ({"triemask_values": ["ok", "\ud800"]}, "item 1 is not valid Unicode"),
        ({"triemask_values": ["x" * 2000]}, "more than the server's limit of 1024"),
        ({"triemask_values": ["ok", "boom"]}, "MemoryError: cannot allocate the edges"),
    ],
)
def test_a_bad_request_is_aborted_alone_inside_the_forward_pass(
    sglang, custom_params, reason, caplog, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from triemask.integrations.serving import CompiledSets

    compile_set = CompiledSets._compile

    def fails_on_boom(self, values):  # type: ignore[no-untyped-def]  # e.g. the edge-key limit or memory
        if "boom" in values:
            raise MemoryError("cannot allocate the edges")
        return compile_set(self, values)

    monkeypatch.setattr(CompiledSets, "_compile", fails_on_boom)
    tokenizer = byte_level_tokenizer()
    eos = tokenizer.eos_token_id  # type: ignore[attr-defined]
    case = abs(hash(reason))  # request ids are global to the adapter: one pair per case
    bad, good = _request(f"bad-{case}", tokenizer), _request(f"good-{case}", tokenizer)
    for _ in range(2):  # checked once: the second step neither raises nor aborts again
        logits = torch.zeros(3, 300)
        batch = [{**custom_params, "__req__": bad}, {"triemask_values": ["yes", "no"], "__req__": good}, None]
        out = sglang.adapter.TriemaskLogitProcessor()(logits, batch)
        assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [eos]  # only EOS: it stops now
        assert torch.isfinite(out[1]).sum() == 2 and torch.isfinite(out[2]).all()
    assert reason in bad.aborted and good.aborted is None
    assert caplog.text.count(reason) == 1


def test_odd_custom_params_and_grammars_never_raise(sglang, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    tokenizer = byte_level_tokenizer()
    logits = torch.zeros(3, 300)
    out = sglang.adapter.TriemaskLogitProcessor()(logits, [["triemask_values"], "triemask_set", None])
    assert torch.isfinite(out).all()  # not mappings: not triemask requests
    backend = sglang.adapter.TriemaskGrammarBackend(tokenizer, 300, {tokenizer.eos_token_id})  # type: ignore[attr-defined]

    def chokes(kind: str, text: str) -> None:
        raise RecursionError("too deep")

    monkeypatch.setattr(sglang.adapter, "literal_alternatives", chokes)
    assert backend.dispatch_regex("(" * 10_000) is _INVALID_GRAMMAR


def test_grammar_backend_compiles_alternations_and_hands_on_the_rest(sglang) -> None:  # type: ignore[no-untyped-def]
    tokenizer = byte_level_tokenizer()
    eos = tokenizer.eos_token_id  # type: ignore[attr-defined]
    fallback = _XGrammarBackend(tokenizer, 300)
    backend = sglang.adapter.TriemaskGrammarBackend(tokenizer, 300, {eos}, fallback=fallback)
    regex = "^(?:" + "|".join(v.replace(".", "\\.") for v in VALUES) + ")$"
    ebnf = "root ::= " + " | ".join(f'"{v}"' for v in VALUES)
    finite = "[0-9]{2}-(ab|c)?x"  # a finite regex: its acyclic automaton, in triemask
    grammars = [
        backend.dispatch_regex(regex),
        backend.dispatch_ebnf(ebnf),
        backend.dispatch_regex("yes|no"),
        backend.dispatch_regex(finite),
    ]
    assert all(isinstance(g, sglang.adapter.TriemaskGrammar) for g in grammars)
    # SGLang's loop: one bitmask for the batch, each grammar fills its row, the mask is applied
    rng = np.random.default_rng(1)
    copies = [g.copy() for g in grammars]
    outputs: list[list[int]] = [[] for _ in copies]
    for _ in range(40):
        live = [i for i, g in enumerate(copies) if not g.is_terminated()]
        if not live:
            break
        mask = copies[live[0]].allocate_vocab_mask(300, len(live), "cpu")
        for row, i in enumerate(live):
            copies[i].fill_vocab_mask(mask, row)
        mask = copies[live[0]].move_vocab_mask(mask, torch.device("cpu"))
        logits = torch.from_numpy(rng.standard_normal((len(live), 300)).astype(np.float32))
        copies[live[0]].apply_vocab_mask(logits, mask)
        for row, i in enumerate(live):
            token = int(torch.argmax(logits[row]))
            copies[i].accept_token(token)
            outputs[i].append(token)
    assert all(g.is_terminated() for g in copies)
    assert all(_spelled(tokenizer, o) in s for o, s in zip(outputs, [VALUES, VALUES, ["yes", "no"]], strict=False))
    assert re.fullmatch(finite, _spelled(tokenizer, outputs[3]))
    with pytest.raises(ValueError, match="not allowed"):
        grammars[2].copy().accept_token(tokenizer.convert_tokens_to_ids("x"))  # type: ignore[attr-defined]
    # not a finite set: xgrammar's backend gets it, untouched
    assert backend.dispatch_regex("[a-z]+") == ("xgrammar", "dispatch_regex", "[a-z]+")
    assert backend.dispatch_json('{"type": "string"}')[1] == "dispatch_json"
    assert fallback.calls == [("dispatch_regex", "[a-z]+"), ("dispatch_json", '{"type": "string"}')]
    # finite but wide: its automaton would pass the server's budget, so xgrammar's regex takes it
    backend.limits = dataclasses.replace(backend.limits, max_automaton_bytes=1 << 14)
    assert backend.dispatch_regex(".{0,300}") == ("xgrammar", "dispatch_regex", ".{0,300}")
    fallback.calls.clear()
    # what cannot be compiled is SGLang's invalid grammar (SGLang aborts that request), never an exception
    assert backend.dispatch_regex("\\ud800|yes") is sglang.adapter._INVALID_GRAMMAR is _INVALID_GRAMMAR
    assert backend.dispatch_regex("|".join(f"v{i}" for i in range(100_001))) is _INVALID_GRAMMAR  # over the limit

    def out_of_memory(values: list[str]) -> None:
        raise MemoryError("cannot allocate the edges")

    backend.compiler = SimpleNamespace(compile=out_of_memory)
    assert backend.dispatch_ebnf('root ::= "a" | "b"') is _INVALID_GRAMMAR


def test_register_adds_the_backend_once(sglang) -> None:  # type: ignore[no-untyped-def]
    sglang.adapter.register()
    sglang.adapter.register()
    assert sglang.choices.count("triemask") == 1
    tokenizer = byte_level_tokenizer()
    backend = sglang.registry["triemask"](SimpleNamespace(), tokenizer, 300, {tokenizer.eos_token_id})  # type: ignore[attr-defined]
    assert isinstance(backend, sglang.adapter.TriemaskGrammarBackend)


def test_torch_bitmask_application_follows_the_shared_layout(sglang) -> None:  # type: ignore[no-untyped-def]
    mask = torch.randint(-(2**31), 2**31 - 1, (3, 10), dtype=torch.int32)
    logits = torch.zeros(3, 330)  # wider than the mask's 320 bits: the extra columns close
    sglang.adapter._apply_bitmask(logits, mask)
    bits = np.unpackbits(mask.numpy().view(np.uint8), axis=1, bitorder="little").astype(bool)
    assert torch.equal(torch.isfinite(logits[:, :320]), torch.from_numpy(bits))
    assert torch.isinf(logits[:, 320:]).all()


def test_json_schemas_with_large_enums_dispatch_to_triemask(sglang) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("xgrammar")
    from triemask import DEFAULT_MIN_ENUM_VALUES, SchemaMatcher

    tokenizer = byte_level_tokenizer()
    eos = tokenizer.eos_token_id  # type: ignore[attr-defined]
    fallback = _XGrammarBackend(tokenizer, 300)
    backend = sglang.adapter.TriemaskGrammarBackend(tokenizer, 300, {eos}, fallback=fallback)
    names = [*VALUES, *(f"tool_{i}" for i in range(DEFAULT_MIN_ENUM_VALUES))]
    large = json.dumps({"type": "object", "properties": {"name": {"enum": names}}, "required": ["name"]})
    small = json.dumps({"type": "object", "properties": {"name": {"enum": VALUES}}, "required": ["name"]})
    grammar = backend.dispatch_json(large)
    assert isinstance(grammar, sglang.adapter.TriemaskGrammar) and isinstance(grammar.matcher, SchemaMatcher)
    assert backend.dispatch_json(small)[1] == "dispatch_json"  # below the threshold: xgrammar's, untouched
    assert backend.dispatch_json("$$ANY$$")[1] == "dispatch_json"
    rng = np.random.default_rng(2)
    grammars = [grammar.copy() for _ in range(3)]
    for _ in range(60):
        live = [g for g in grammars if not g.is_terminated()]
        if not live:
            break
        mask = live[0].allocate_vocab_mask(300, len(live), "cpu")
        for row, g in enumerate(live):
            g.fill_vocab_mask(mask, row)
        logits = torch.from_numpy(rng.standard_normal((len(live), 300)).astype(np.float32))
        live[0].apply_vocab_mask(logits, mask)
        for row, g in enumerate(live):
            g.accept_token(int(torch.argmax(logits[row])))
    for g in grammars:
        assert g.is_terminated() and g.matcher.value["name"] in names
    bad = json.dumps({"type": "object", "properties": {"name": {"enum": [*names, "\ud800"]}}})
    assert backend.dispatch_json(bad) is _INVALID_GRAMMAR  # a value JSON text cannot hold: invalid, not raised
    assert backend.dispatch_json('{"a":' * 5_000 + "1" + "}" * 5_000) is _INVALID_GRAMMAR  # too deep for any parser


def _sglang_tool_schema(tools: list[dict[str, Any]], parallel_tool_calls: bool = True) -> dict[str, Any]:
    """SGLang's schema for ``tool_choice="required"``, reproduced exactly (SGLang is not
    installable here): ``get_json_schema_constraint`` and ``_get_tool_schema`` in
    python/sglang/srt/function_call/utils.py, sgl-project/sglang at 00ca197b (its $defs merged
    from the tools' parameters)."""
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "anyOf": [
                {
                    "properties": {
                        "name": {"type": "string", "enum": [tool["function"]["name"]]},
                        "parameters": tool["function"].get("parameters") or {"type": "object", "properties": {}},
                    },
                    "required": ["name", "parameters"],
                }
                for tool in tools
            ],
        },
    }
    if not parallel_tool_calls:
        schema["maxItems"] = 1
    defs: dict[str, Any] = {}
    for tool in tools:
        defs.update((tool["function"].get("parameters") or {}).get("$defs", {}))
    if defs:
        schema["$defs"] = defs
    return schema


def test_tool_requests_with_many_tools_dispatch_to_triemask(sglang) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("xgrammar")
    from triemask import SchemaMatcher
    from triemask.schemas import DEFAULT_MIN_UNION_BRANCHES

    tokenizer = byte_level_tokenizer()
    eos = tokenizer.eos_token_id  # type: ignore[attr-defined]
    fallback = _XGrammarBackend(tokenizer, 300)
    backend = sglang.adapter.TriemaskGrammarBackend(tokenizer, 300, {eos}, fallback=fallback)
    shared = {"$defs": {"Unit": {"enum": ["c", "f"]}}}
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "parameters": {
                    "type": "object",
                    "properties": {"n": {"type": "integer"}, "unit": {"$ref": "#/$defs/Unit"}},
                    "required": ["n", "unit"],
                    **shared,
                }
                if i % 2
                else None,
            },
        }
        for i in range(DEFAULT_MIN_UNION_BRANCHES)
    ]
    for parallel in (True, False):
        grammar = backend.dispatch_json(json.dumps(_sglang_tool_schema(tools, parallel)))
        assert isinstance(grammar, sglang.adapter.TriemaskGrammar) and isinstance(grammar.matcher, SchemaMatcher)
        assert grammar.matcher.schema.stats()["unions"][0]["branches"] == len(tools)
        text = '[{"name": "tool_3", "parameters": {"n": 7, "unit": "f"}}]'
        for token in tokenizer.encode(text, add_special_tokens=False):  # type: ignore[attr-defined]
            grammar.accept_token(token)  # (raises where the token is not allowed)
        assert grammar.matcher.value == [{"name": "tool_3", "parameters": {"n": 7, "unit": "f"}}]
    few = json.dumps(_sglang_tool_schema(tools[:8]))
    assert backend.dispatch_json(few)[1] == "dispatch_json"  # below the threshold: xgrammar's, untouched


def test_jump_forward_hooks_follow_sglangs_retokenization(sglang) -> None:  # type: ignore[no-untyped-def]
    """SGLang's jump-forward: try_jump_forward gives the forced text, SGLang appends it to the
    output and tokenizes the whole output again, jump_and_retokenize undoes the tokens past
    the common prefix and accepts the new ones; the grammar then equals one fed the new ids."""
    pytest.importorskip("xgrammar")
    tokenizer = byte_level_tokenizer()
    eos = tokenizer.eos_token_id  # type: ignore[attr-defined]
    backend = sglang.adapter.TriemaskGrammarBackend(tokenizer, 300, {eos}, fallback=_XGrammarBackend(tokenizer, 300))
    names = ["slack.get_user", "slack.get_users", "slack.send_message"] + [f"tool_{i:03d}" for i in range(300)]
    schema = {"type": "object", "properties": {"name": {"enum": names}}, "required": ["name"]}
    for grammar, typed in [
        (backend.dispatch_regex("|".join(n.replace(".", "\\.") for n in names)), "s"),
        (backend.dispatch_json(json.dumps(schema)), '{"name": "s'),
    ]:
        assert isinstance(grammar, sglang.adapter.TriemaskGrammar)
        old_ids = tokenizer.encode(typed)  # type: ignore[attr-defined]
        for token in old_ids:
            grammar.accept_token(token)
        helper = grammar.try_jump_forward(tokenizer)
        assert helper is not None
        text, state = grammar.jump_forward_str_state(helper)
        assert text == "lack."
        new_ids = tokenizer.encode(typed + text)  # type: ignore[attr-defined]
        grammar.jump_and_retokenize(old_ids, new_ids, state)
        fresh = grammar.copy()
        for token in new_ids:
            fresh.accept_token(token)
        masks = [g.allocate_vocab_mask(300, 1, "cpu") for g in (grammar, fresh)]
        for g, mask in zip((grammar, fresh), masks, strict=True):
            g.fill_vocab_mask(mask, 0)
        assert torch.equal(masks[0], masks[1])
        assert grammar.try_jump_forward(tokenizer) is None  # "get_" or "send_message" comes next
        with pytest.raises(ValueError, match="cannot retokenize"):  # more than it can undo: SGLang aborts it
            grammar.jump_and_retokenize([1] * 300, [2], -1)
