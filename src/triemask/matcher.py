"""The per-request matcher: a state id and a short history over a shared automaton."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .automata import DEAD, DagLanguage, TrieAutomaton, native_kernel, whole_characters
from .base import ArgumentTypeError, StateError, integer, kernels
from .schemas import CompiledSchema, SchemaMatcher

__all__ = ["Matcher"]


class _MatcherCore:
    """The matcher's per-request fields and per-step methods, in Python. With the C
    extension, ``triemask.base._native.MatcherCore`` takes its place: the same fields and
    methods in C (a Python call per step less), deferring to the ``_reference`` methods
    below for whatever the kernel does not take."""

    __slots__ = ("_history", "_kernel", "_state", "_tokens")
    _history: deque[int]
    _kernel: Any
    _state: int
    _tokens: list[int] | None

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token. Returns False, leaving the state unchanged, when the
        token is not allowed (any integer is accepted as input; none raises)."""
        return self._accept_token_reference(token_id)

    def fill_next_token_bitmask(self, bitmask: Any, row: int = 0) -> None:
        """Overwrite row ``row`` of ``bitmask`` with the mask of the next token.

        ``bitmask`` is an int32 numpy array or CPU torch tensor of shape
        ``(batch, ceil(vocab_size / 32))`` (or one row of it).
        """
        self._fill_reference(bitmask, row)

    def _accept_token_reference(self, token_id: int) -> bool:
        raise NotImplementedError

    def _fill_reference(self, bitmask: Any, row: int = 0) -> None:
        raise NotImplementedError


if TYPE_CHECKING or kernels.KERNELS is None:  # noqa: SIM108 (type checkers see the Python class)
    _Core = _MatcherCore
else:
    _Core = kernels.KERNELS.MatcherCore


class Matcher(_Core):
    """Tracks one sequence through a :class:`TrieAutomaton`.

    A matcher is a state id plus the last ``max_rollback`` states (and, over a
    :class:`~triemask.DagAutomaton`, whose states do not determine the text, the
    tokens accepted so far: at most the longest string's length), so it is cheap
    to create and to :meth:`copy` (for beam search or speculative decoding); the
    automaton is shared, never copied.

    ``Matcher(compiled_schema)`` with a :class:`~triemask.CompiledSchema` (a JSON
    schema or a tool list) returns a :class:`~triemask.SchemaMatcher`, which has the
    same methods and reads the finished output as parsed JSON (``.value``).

    Parameters
    ----------
    automaton : TrieAutomaton or CompiledSchema
        The compiled set (or schema).
    max_rollback : int
        How many accepted tokens :meth:`rollback` can undo.

    Examples
    --------
    >>> from triemask import Compiler, Matcher, Vocabulary
    >>> vocab = Vocabulary([b"yes", b"no", b"n", b"o", None], eos_token_ids=4)
    >>> matcher = Matcher(Compiler(vocab).compile(["yes", "no"]))
    >>> matcher.accept_token(2), matcher.accept_token(0), matcher.accept_token(3)
    (True, False, True)
    >>> matcher.value, matcher.accept_token(4), matcher.is_terminated()
    ('no', True, True)
    """

    __slots__ = ("_automaton",)  # and _MatcherCore's: _history, _kernel, _state, _tokens

    def __new__(cls, automaton: TrieAutomaton | CompiledSchema | None = None, *, max_rollback: int = 16) -> Matcher:
        # (automaton defaults to None so that copy and pickle, which call __new__ bare, still work)
        if cls is Matcher and isinstance(automaton, CompiledSchema):
            # a compiled JSON schema or tool list: the same interface, another state
            return SchemaMatcher(automaton, max_rollback=max_rollback)  # type: ignore[return-value]
        return super().__new__(cls)

    def __init__(self, automaton: TrieAutomaton | CompiledSchema, *, max_rollback: int = 16) -> None:
        if not isinstance(automaton, TrieAutomaton):
            raise ArgumentTypeError(f"Matcher needs a TrieAutomaton, got {type(automaton).__qualname__}")
        max_rollback = integer(max_rollback, "max_rollback", StateError, "an integer in [0, 2**31)")
        if not 0 <= max_rollback < 1 << 31:
            raise StateError(f"max_rollback must be an integer in [0, 2**31), got {max_rollback}")
        self._automaton = automaton
        self._state = automaton.initial_state
        self._history = deque(maxlen=max_rollback)
        self._tokens = [] if isinstance(automaton, DagLanguage) else None
        self._kernel = native_kernel(automaton)  # the C loops, called directly on the per-step path

    def __getstate__(self) -> tuple[TrieAutomaton, int, deque[int], list[int] | None]:
        return self._automaton, self._state, self._history, self._tokens

    def __setstate__(self, state: tuple[TrieAutomaton, int, deque[int], list[int] | None]) -> None:
        self._automaton, self._state, self._history, self._tokens = state
        self._kernel = native_kernel(self._automaton)

    @property
    def automaton(self) -> TrieAutomaton:
        """The shared automaton."""
        return self._automaton

    @property
    def state(self) -> int:
        """The current state id."""
        return self._state

    @property
    def value(self) -> str | bytes | None:
        """The value spelled so far if it is complete, else None."""
        if self._tokens is not None:
            automaton = self._automaton
            assert isinstance(automaton, DagLanguage)
            return automaton.spell(self._tokens) if automaton.is_accepting(self._state) else None
        return self._automaton.value_of(self._state)

    def find_jump_forward_string(self) -> str | bytes:
        """What every continuation from here begins with (xgrammar's name): the bytes a
        decoding loop may append without asking the model (jump-forward decoding), ``str``
        where the automaton's values are ``str`` (then its longest whole-UTF-8 prefix, ``""``
        inside a character, as xgrammar answers), else ``bytes``; empty where a value may end
        or the next byte is open, and once terminated.

        Examples
        --------
        >>> from triemask import Compiler, Matcher, Vocabulary
        >>> vocab = Vocabulary([bytes([b]) for b in range(128)] + [None], eos_token_ids=128)
        >>> matcher = Matcher(Compiler(vocab).compile(["get_user", "get_item"]))
        >>> matcher.find_jump_forward_string()
        'get_'
        >>> matcher.accept_tokens(b"get_u"), matcher.find_jump_forward_string()
        (5, 'ser')
        """
        forced = self._automaton.forced_bytes(self._state)
        return whole_characters(forced) if self._automaton.values_are_str else forced

    def _accept_token_reference(self, token_id: int) -> bool:
        # accept_token (the C one defers here for anything but an exact int it can look up)
        try:  # bools, floats and other non-integers are rejected here (StateError)
            following = self._automaton.next_state(self._state, token_id)
        except (TypeError, ValueError, OverflowError):
            return False
        if following == DEAD:
            return False
        self._history.append(self._state)
        self._state = following
        if self._tokens is not None:
            self._tokens.append(int(token_id))
        return True

    def accept_tokens(self, token_ids: Iterable[int]) -> int:
        """Accept tokens in order until one is rejected; returns how many were accepted."""
        accepted = 0
        if not isinstance(token_ids, Iterable):
            raise ArgumentTypeError(f"token_ids must be an iterable of integers, got {type(token_ids).__name__}")
        for token_id in token_ids:
            if not self.accept_token(token_id):
                break
            accepted += 1
        return accepted

    def rollback(self, num_tokens: int = 1) -> None:
        """Undo the last ``num_tokens`` accepted tokens."""
        num_tokens = integer(num_tokens, "num_tokens", StateError, "an integer")
        if num_tokens < 0 or num_tokens > len(self._history):
            raise StateError(
                f"cannot roll back {num_tokens} tokens: {len(self._history)} can be undone "
                f"(max_rollback={self._history.maxlen})"
            )
        for _ in range(num_tokens):
            self._state = self._history.pop()
        if self._tokens is not None and num_tokens:
            del self._tokens[-num_tokens:]

    def reset(self) -> None:
        """Return to the initial state and forget the history."""
        self._state = self._automaton.initial_state
        self._history.clear()
        if self._tokens is not None:
            self._tokens.clear()

    def copy(self) -> Matcher:
        """An independent matcher in the same state, sharing the automaton."""
        clone = Matcher.__new__(Matcher)
        clone._automaton = self._automaton
        clone._state = self._state
        clone._history = self._history.copy()
        clone._tokens = None if self._tokens is None else self._tokens.copy()
        clone._kernel = self._kernel
        return clone

    def __copy__(self) -> Matcher:
        return self.copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> Matcher:
        return self.copy()  # the automaton is immutable and shared, never copied

    def is_terminated(self) -> bool:
        """True once no further token can be accepted: EOS was accepted, or (with
        ``eos=False``) the value is complete and nothing extends it."""
        return self._automaton.is_final(self._state) or (
            self._automaton.allowed_token_ids(self._state).size == 0 and self._automaton.is_accepting(self._state)
        )

    def allowed_token_ids(self) -> npt.NDArray[np.int32]:
        """Ids allowed next, ascending."""
        return self._automaton.allowed_token_ids(self._state)

    def _fill_reference(self, bitmask: Any, row: int = 0) -> None:
        # fill_next_token_bitmask (the C one defers here for a buffer it does not take)
        self._automaton.fill_row(bitmask, self._state, row)

    def __repr__(self) -> str:
        return f"Matcher(state={self._state}, value={self.value!r})"
