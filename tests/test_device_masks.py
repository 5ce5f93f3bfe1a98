"""Device-side masks (``triemask.integrations.torch``) on CPU torch: equal to the automaton's."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import byte_vocabulary, real_compiler
from triemask import DEAD, ArgumentTypeError, BitmaskError, Compiler, StateError
from triemask.datasets import synthetic_tools

torch = pytest.importorskip("torch")
from triemask.integrations.torch import DeviceAutomaton  # noqa: E402


def _automata() -> list[object]:
    return [
        Compiler(byte_vocabulary()).compile(["get", "get_user", "user", "us", "🦙", ""]),
        real_compiler("qwen2").compile(synthetic_tools(300)),
        real_compiler("mistral-spm-32k").compile(["Paris", "Par", "London", "naïve 🦙"], eos=False),
    ]


@pytest.mark.parametrize("which", range(3))
def test_masks_and_steps_equal_the_automaton(which: int) -> None:
    automaton = _automata()[which]
    on_device = DeviceAutomaton(automaton)  # type: ignore[arg-type]
    rng = np.random.default_rng(which)
    states = rng.integers(DEAD, automaton.num_states, 200)  # type: ignore[attr-defined]
    states[:3] = [0, DEAD, automaton.num_states - 1]  # type: ignore[attr-defined]
    mask = on_device.allowed_mask(torch.from_numpy(states), ended_allow_eos=False).numpy()
    assert mask.shape == (200, automaton.vocab_size)  # type: ignore[attr-defined]
    for row, state in enumerate(states.tolist()):
        assert np.flatnonzero(mask[row]).tolist() == automaton.allowed_token_ids(state).tolist()  # type: ignore[attr-defined]
    # tokens: one allowed token where there is one, else a random one
    tokens = rng.integers(0, automaton.vocab_size, len(states))  # type: ignore[attr-defined]
    for row, state in enumerate(states.tolist()):
        allowed = automaton.allowed_token_ids(state)  # type: ignore[attr-defined]
        if allowed.size and row % 3:
            tokens[row] = rng.choice(allowed)
    got = on_device.next_states(torch.from_numpy(states), torch.from_numpy(tokens)).numpy()
    assert got.tolist() == automaton.next_states(states, tokens).tolist()  # type: ignore[attr-defined]


def test_ended_rows_may_stop_and_wider_logits_stay_closed() -> None:
    automaton = Compiler(byte_vocabulary()).compile(["ab", "a"])
    eos = automaton.eos_token_ids[0]
    final = automaton.next_state(automaton.next_state(0, ord("a")), eos)
    on_device = DeviceAutomaton(automaton)
    states = torch.tensor([0, final, DEAD])
    mask = on_device.allowed_mask(states, automaton.vocab_size + 7)
    assert mask.shape == (3, automaton.vocab_size + 7) and not mask[:, automaton.vocab_size :].any()
    assert mask[1].nonzero().flatten().tolist() == [eos] == mask[2].nonzero().flatten().tolist()
    logits = torch.zeros(3, automaton.vocab_size + 7)
    out = on_device.mask_logits(logits, states)
    assert out is logits and torch.isinf(out[0]).sum() == automaton.vocab_size + 7 - len(automaton.allowed_token_ids(0))
    assert on_device.memory_bytes > 0


def test_bad_inputs_are_explained() -> None:
    on_device = DeviceAutomaton(Compiler(byte_vocabulary()).compile(["ab"]))
    with pytest.raises(StateError, match=r"1-D int64 tensor, got tensor of dtype torch\.float32"):
        on_device.allowed_mask(torch.zeros(2))
    with pytest.raises(StateError, match="1-D sequence of integers, got array of dtype float64"):
        on_device.allowed_mask([0.5, 1.0])
    with pytest.raises(StateError, match="not a state"):
        on_device.allowed_mask([0, 10**6])
    with pytest.raises(BitmaskError, match="smaller than the automaton"):
        on_device.allowed_mask(torch.tensor([0]), 3)
    with pytest.raises(BitmaskError, match=r"logits must be a \(batch=1, vocab\) tensor"):
        on_device.mask_logits(torch.zeros(2, 300), torch.tensor([0]))
    with pytest.raises(StateError, match="token_ids must be a tensor of shape"):
        on_device.next_states(torch.tensor([0]), torch.tensor([1, 2]))
    with pytest.raises(ArgumentTypeError, match="needs a TrieAutomaton"):
        DeviceAutomaton("ab")  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="a lazy automaton stores none: compile the set with layout='trie'"):
        DeviceAutomaton(Compiler(byte_vocabulary()).compile(["ab"], layout="lazy"))
    with pytest.raises(ArgumentTypeError, match="not a torch device"):
        DeviceAutomaton(on_device.automaton, "no-such-device")


def test_work_follows_the_rows_states_not_the_widest_node() -> None:
    """150,000 single-token values: the root allows 150,000 tokens, every other state a
    few. Rows past the root cost what their own states allow; rows at the root (more
    than half the vocabulary allowed) cost their ~2,000 disallowed tokens. Masks stay exact."""
    compiler = real_compiler("qwen2")
    vocab = compiler.vocab
    singles = [vocab.token_bytes(int(t)) for t in vocab.text_token_ids()[:150_000]]
    automaton = compiler.compile(sorted({b for b in singles if b is not None}))
    on_device = DeviceAutomaton(automaton)
    assert len(automaton.allowed_token_ids(0)) > 100_000
    deep = np.array([automaton.next_state(0, int(t)) for t in vocab.text_token_ids()[1000:1064]])
    expected = sum(len(automaton.allowed_token_ids(s)) or len(automaton.eos_token_ids) for s in deep.tolist())
    for states in (deep, torch.from_numpy(deep)):
        plan = on_device._plan(states, True)
        assert len(plan.allowed_rows) == len(plan.allowed_tokens) == expected < 64 * 100 and len(plan.wide) == 0
    eos = automaton.eos_token_ids[0]
    final = automaton.next_state(deep[0], eos)
    mixed = np.array([0, *deep[:5].tolist(), 0, DEAD, final, 0])
    for states in (mixed, torch.from_numpy(mixed)):
        plan = on_device._plan(states, True)
        assert sorted(np.asarray(plan.wide).tolist()) == [0, 6, 9]
        assert len(plan.banned_rows) == 3 * (automaton.vocab_size - len(automaton.allowed_token_ids(0))) < 3 * 3000
        mask = on_device.allowed_mask(states, automaton.vocab_size + 3).numpy()
        for row, state in enumerate(mixed.tolist()):
            live = 0 <= state < automaton.num_nodes
            allowed = automaton.allowed_token_ids(state).tolist() if live else list(automaton.eos_token_ids)
            assert np.flatnonzero(mask[row]).tolist() == allowed
        logits = torch.randn(12, automaton.vocab_size + 3)
        before = logits.clone()
        where = torch.tensor([11, 0, 1, 2, 3, 4, 5, 6, 7, 8])
        on_device.mask_logits(logits, states, where)
        assert torch.equal(torch.isfinite(logits[where]), torch.from_numpy(mask))
        assert torch.equal(logits[where][torch.from_numpy(mask)], before[where][torch.from_numpy(mask)])
        assert torch.equal(logits[9:11], before[9:11])  # rows not named are untouched
    # four int64 arrays per edge; the wide rows' banned tokens cost little beside them
    assert on_device.memory_bytes < 40 * automaton.stats()["edges"]


@pytest.mark.parametrize("which", range(3))
@pytest.mark.parametrize("ended_allow_eos", [True, False])
def test_in_place_masking_of_chosen_rows_equals_the_mask(which: int, ended_allow_eos: bool) -> None:
    automaton = _automata()[which]  # the third has eos=False: its value ends allow nothing
    on_device = DeviceAutomaton(automaton)  # type: ignore[arg-type]
    rng = np.random.default_rng(which)
    states = torch.from_numpy(rng.integers(DEAD, automaton.num_states, 40))  # type: ignore[attr-defined]
    logits = torch.from_numpy(rng.standard_normal((60, automaton.vocab_size + 5)).astype(np.float32))  # type: ignore[attr-defined]
    before = logits.clone()
    rows = torch.from_numpy(rng.permutation(60)[:40])
    host = logits.clone()
    out = on_device.mask_logits(logits, states, rows, ended_allow_eos=ended_allow_eos)
    assert out is logits
    assert torch.equal(on_device.mask_logits(host, states.numpy(), rows, ended_allow_eos=ended_allow_eos), out)
    allowed = on_device.allowed_mask(states, logits.shape[1], ended_allow_eos=ended_allow_eos)
    expected = before.clone()
    expected[rows] = before[rows].masked_fill(~allowed, float("-inf"))
    assert torch.equal(out, expected)
    with pytest.raises(StateError, match=r"rows must be a tensor of shape \(40,\)"):
        on_device.mask_logits(logits, states, rows[:3])


def _states_along(automaton: object, rng: np.random.Generator, count: int) -> list[int]:
    """States reached by random allowed tokens from the start (an updated set's states are pairs:
    not a range to draw from), DEAD and final ones among them."""
    states = [DEAD]
    for _ in range(count):
        state = automaton.initial_state  # type: ignore[attr-defined]
        for _ in range(int(rng.integers(0, 12))):
            allowed = automaton.allowed_token_ids(state)  # type: ignore[attr-defined]
            if not allowed.size:
                break
            state = automaton.next_state(state, int(rng.choice(allowed)))  # type: ignore[attr-defined]
        states.append(state)
    return states


def test_host_planned_masks_and_steps_equal_the_automaton() -> None:
    """An updated set (no edge arrays to upload) is masked and stepped on the device through the
    host's lookups: the same masks and states as the automaton's own, EOS for ended rows."""
    from triemask.integrations.torch import HostPlannedAutomaton, device_automaton

    base = real_compiler("qwen2").compile(synthetic_tools(300))
    values = base.values()
    updated = base.with_values(added=["acme.new_tool", "acme.new_tool_v2"], removed=values[:3])
    assert type(updated).__name__ == "UpdatedTrieAutomaton"
    on_device = device_automaton(updated)
    assert isinstance(on_device, HostPlannedAutomaton) and on_device.memory_bytes == 0
    assert isinstance(device_automaton(base), DeviceAutomaton)
    rng = np.random.default_rng(5)
    states = _states_along(updated, rng, 120)
    mask = on_device.allowed_mask(torch.tensor(states), ended_allow_eos=False).numpy()
    with_eos = on_device.allowed_mask(states).numpy()
    eos = list(updated.eos_token_ids)
    for row, state in enumerate(states):
        allowed = updated.allowed_token_ids(state).tolist()
        assert np.flatnonzero(mask[row]).tolist() == allowed
        assert np.flatnonzero(with_eos[row]).tolist() == (allowed or eos)
    logits = torch.randn(len(states), updated.vocab_size + 3)
    masked = on_device.mask_logits(logits.clone(), states)
    assert torch.equal(torch.isfinite(masked[:, : updated.vocab_size]), torch.from_numpy(with_eos))
    assert not torch.isfinite(masked[:, updated.vocab_size :]).any()
    tokens = [int(rng.choice(updated.allowed_token_ids(s))) if updated.allowed_token_ids(s).size else 7 for s in states]
    stepped = on_device.next_states(torch.tensor(states), torch.tensor(tokens))
    assert stepped.tolist() == [updated.next_state(s, t) for s, t in zip(states, tokens, strict=True)]
    with pytest.raises(StateError):
        on_device.next_states(torch.tensor(states), torch.tensor(tokens[:-1]))


def test_a_lazy_pattern_is_masked_through_the_host() -> None:
    """A pattern in the lazy layout (no edge arrays) is served as the updated sets are: its
    masks and steps on the device equal the automaton's."""
    from triemask.integrations.torch import HostPlannedAutomaton, device_automaton

    lazy = real_compiler("qwen2").compile_format("ipv4", layout="lazy")
    on_device = device_automaton(lazy)
    assert isinstance(on_device, HostPlannedAutomaton)
    rng = np.random.default_rng(9)
    states = _states_along(lazy, rng, 60)
    mask = on_device.allowed_mask(torch.tensor(states), ended_allow_eos=False).numpy()
    for row, state in enumerate(states):
        assert np.flatnonzero(mask[row]).tolist() == lazy.allowed_token_ids(state).tolist()
    tokens = [int(rng.choice(lazy.allowed_token_ids(s))) if lazy.allowed_token_ids(s).size else 7 for s in states]
    stepped = on_device.next_states(torch.tensor(states), torch.tensor(tokens))
    assert stepped.tolist() == [lazy.next_state(s, t) for s, t in zip(states, tokens, strict=True)]
