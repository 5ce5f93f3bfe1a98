"""Matcher: a thin per-request state over a shared automaton."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import byte_vocabulary
from oracle import bitmask_tokens
from triemask import Compiler, Matcher, StateError, allocate_token_bitmask

GET, US, USER = 257, 258, 259  # "get", "_us", "user" in byte_vocabulary()


@pytest.fixture
def matcher() -> Matcher:
    return Matcher(Compiler(byte_vocabulary()).compile(["get", "get_user", "get_users"]), max_rollback=3)


def test_accept_reject_and_value(matcher: Matcher) -> None:
    eos = matcher.automaton.eos_token_ids[0]
    assert matcher.state == 0 and matcher.value is None
    assert matcher.accept_token(GET) and matcher.value == "get"
    state = matcher.state
    for rejected in (ord("x"), USER, -5, 10**12, "x", 3.5, float(ord("_"))):  # a float is not truncated
        assert not matcher.accept_token(rejected)  # type: ignore[arg-type]  # never raises
        assert matcher.state == state
    assert matcher.accept_tokens([ord("_"), USER, ord("s"), eos, ord("s")]) == 4
    assert matcher.value == "get_users" and matcher.is_terminated()
    assert matcher.allowed_token_ids().size == 0 and "get_users" in repr(matcher)


def test_rollback_reset_copy(matcher: Matcher) -> None:
    matcher.accept_tokens([ord("g"), ord("e"), ord("t"), ord("_")])
    with pytest.raises(StateError, match="cannot roll back 4 tokens: 3 can be undone"):
        matcher.rollback(4)
    matcher.rollback(2)
    assert matcher.accept_token(ord("t")) and matcher.value == "get"
    clone = matcher.copy()
    assert clone.accept_token(ord("_")) and clone.state != matcher.state
    assert matcher.value == "get"  # the original is untouched
    clone.rollback(1)
    assert clone.state == matcher.state
    matcher.reset()
    assert matcher.state == 0 and matcher.value is None
    with pytest.raises(StateError):
        matcher.rollback(1)


def test_termination_without_eos() -> None:
    automaton = Compiler(byte_vocabulary()).compile(["get", "get_user"], eos=False)
    matcher = Matcher(automaton)
    matcher.accept_token(GET)
    assert matcher.value == "get" and not matcher.is_terminated()  # "get_user" may follow
    matcher.accept_tokens([ord("_"), USER])
    assert matcher.value == "get_user" and matcher.is_terminated()


def test_fill_next_token_bitmask(matcher: Matcher) -> None:
    vocab_size = matcher.automaton.vocab_size
    bitmask = allocate_token_bitmask(3, vocab_size)
    matcher.fill_next_token_bitmask(bitmask, row=1)
    assert bitmask_tokens(bitmask[1], vocab_size) == {ord("g"), 256, GET}  # g, ge, get
    assert (bitmask[0] == -1).all() and (bitmask[2] == -1).all()  # other rows untouched
    matcher.accept_token(GET)
    row = bitmask[2]
    matcher.fill_next_token_bitmask(row)  # a single 1-D row works too
    assert bitmask_tokens(row, vocab_size) == {ord("_"), US, matcher.automaton.eos_token_ids[0]}
    with pytest.raises(StateError, match="row 3 is outside"):
        matcher.fill_next_token_bitmask(bitmask, row=3)


def test_constructor_checks() -> None:
    with pytest.raises(TypeError, match="needs a TrieAutomaton"):
        Matcher(object())  # type: ignore[arg-type]
    automaton = Compiler(byte_vocabulary()).compile(["a"])
    with pytest.raises(ValueError, match=r"max_rollback must be an integer in \[0, 2\*\*31\)"):
        Matcher(automaton, max_rollback=-1)
    assert np.array_equal(Matcher(automaton).allowed_token_ids(), automaton.allowed_token_ids(0))


def test_matchers_pickle_and_copy_like_any_object() -> None:
    import copy
    import pickle

    from triemask import Compiler, Matcher, Vocabulary

    vocab = Vocabulary([b"a", b"b", b"ab", None], eos_token_ids=3)
    matcher = Matcher(Compiler(vocab).compile(["ab", "b"]))
    matcher.accept_token(0)
    for clone in (pickle.loads(pickle.dumps(matcher)), copy.copy(matcher), copy.deepcopy(matcher), matcher.copy()):
        assert clone.state == matcher.state and clone.accept_token(1) and clone.value == "ab"
