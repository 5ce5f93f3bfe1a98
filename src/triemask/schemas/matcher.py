"""The per-request matcher of a mixed schema and the batch fills."""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from ..automata import whole_characters
from ..base import ArgumentTypeError, StateError, as_bitmask_array, bitmask_width, integer, kernels, unpack_bitmask
from .compiled import CompiledSchema
from .json_lexer import LEX_OUT, LEX_REFUSED
from .structure import STRUCT, Configuration
from .support import handles_usable

MAX_JUMP_BYTES = 1024
"""The most :meth:`SchemaMatcher.find_jump_forward_string` answers at once (a decoding loop asks
again after appending it): each byte is a mask fill on a fork, so a schema forcing a long
``const`` never holds a serving engine's step for more than about 20 ms."""

Step = tuple[list[Configuration], int, int, Any]
"""One accepted token, as rollback restores it: the configurations, the output's length and the
lexer state before it, and the xgrammar matcher it advanced in place (else None)."""


class _Steps(Protocol):
    """A matcher's rollback history: a ``deque(maxlen=...)`` of :data:`Step`, or the C ring with
    the same methods (``_native.History``)."""

    @property
    def maxlen(self) -> int | None: ...  # (a deque's type says None is possible; these never are)

    def append(self, step: Step, /) -> None: ...

    def pop(self) -> Step: ...

    def clear(self) -> None: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Step]: ...


def _new_history(maxlen: int, steps: Iterable[Step] = ()) -> _Steps:
    """A new rollback history keeping the newest ``maxlen`` steps, ``steps`` in it: the C ring
    with the extension (a step records four fields, no tuple), else a deque."""
    native = kernels.KERNELS
    if native is None:
        return deque(steps, maxlen=maxlen)
    made: _Steps = native.History(maxlen)
    for step in steps:
        made.append(step)
    return made


# --------------------------------------------------------------------------- matcher


class _SchemaMatcherCore:
    """The schema matcher's per-request fields and per-step methods, in Python. With the C
    extension, ``triemask.base._native.SchemaCore`` takes its place: the same fields, and the
    common steps in C (in the structure: one xgrammar call and the lexer's tables; inside an
    enum value: the trie's kernel), deferring to the ``_reference`` methods of
    :class:`SchemaMatcher` for the others (csrc/schema_step.c says which)."""

    __slots__ = ("_configs", "_filled", "_history", "_lexer", "_output", "_schema", "_scratch", "_scratch_width")
    _schema: CompiledSchema
    _configs: list[Configuration]
    _history: _Steps
    _output: bytearray
    _lexer: int
    _filled: list[Configuration] | None
    _scratch: npt.NDArray[np.int32]
    _scratch_width: int

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (state unchanged) when it is not allowed."""
        return self._accept_token_reference(token_id)

    def fill_next_token_bitmask(self, bitmask: Any, row: int = 0) -> None:
        """Overwrite row ``row`` of ``bitmask`` (int32, ``(batch, ceil(vocab_size / 32))``,
        numpy or CPU torch) with the mask of the next token."""
        self._fill_reference(bitmask, row)

    def _accept_token_reference(self, token_id: int) -> bool:
        raise NotImplementedError

    def _fill_reference(self, bitmask: Any, row: int = 0) -> None:
        raise NotImplementedError


if TYPE_CHECKING or kernels.KERNELS is None:  # noqa: SIM108 (type checkers see the Python class)
    _Core = _SchemaMatcherCore
else:
    _Core = kernels.KERNELS.SchemaCore


class SchemaMatcher(_Core):
    """Follows one output through a :class:`CompiledSchema` (``triemask.Matcher(compiled)``).

    The same interface as :class:`~triemask.Matcher` for a set; :attr:`value` is
    the parsed JSON once the output is complete.
    """

    __slots__ = ()  # the fields are the core's: _schema, _configs, _history, _output, _lexer, ...

    def __init__(self, schema: CompiledSchema, *, max_rollback: int = 16) -> None:
        if not isinstance(schema, CompiledSchema):
            raise ArgumentTypeError(f"SchemaMatcher needs a CompiledSchema, got {type(schema).__qualname__}")
        max_rollback = integer(max_rollback, "max_rollback", StateError, "an integer in [0, 2**31)")
        if not 0 <= max_rollback < 1 << 31:
            raise StateError(f"max_rollback must be an integer in [0, 2**31), got {max_rollback}")
        self._schema = schema
        self._configs = schema._initial()
        # (configurations, output length, lexer state, the matcher advanced in place or None) per step
        self._history = _new_history(max_rollback)
        self._output = bytearray()
        self._lexer = LEX_OUT  # the JSON lexer state at the end of the output
        self._scratch = np.zeros((1, schema._support.xgr_width), dtype=np.int32)
        self._scratch_width = schema._support.width
        self._filled: list[Configuration] | None = None

    @property
    def schema(self) -> CompiledSchema:
        """The shared compiled schema."""
        return self._schema

    @property
    def text(self) -> bytes:
        """The output so far, as bytes."""
        return bytes(self._output)

    @property
    def in_enum_value(self) -> bool:
        """Whether the output may be inside an enum field's value (a trie decides the next
        token), rather than in the structure xgrammar follows."""
        return any(c.field != STRUCT for c in self._configs)

    @property
    def value(self) -> Any:
        """The output parsed as JSON once it is complete, else None.

        A complete output is strict JSON (RFC 8259) in UTF-8: the masks refuse the raw
        control characters and the UTF-8 spelling of surrogates that xgrammar's strings
        admit (an escaped ``\\ud800`` is JSON and stays allowed).

        Raises
        ------
        StateError
            Never expected: the output is complete but not JSON.
        """
        if not any(
            c.field == STRUCT and (c.matcher.is_completed() or c.matcher.is_terminated()) for c in self._configs
        ):
            return None
        try:
            return json.loads(self._output.decode("utf-8"))
        except ValueError as error:  # never expected: the masks keep outputs strict JSON
            raise StateError(f"the completed output is not JSON ({error}): {bytes(self._output)[:80]!r}") from None

    def _accept_token_reference(self, token_id: int) -> bool:
        # accept_token (the C one defers here for the steps it does not take)
        if type(token_id) is not int:
            try:
                token_id = integer(token_id, "token_id")
            except StateError:
                return False
        schema = self._schema
        support = schema._support
        if not 0 <= token_id < schema.vocab_size:
            return False
        if token_id < len(support.tokens):
            data = support.tokens[token_id]
            lexer = support.lexical.after[self._lexer][token_id]
            if lexer == LEX_REFUSED:
                return False
        else:
            data, lexer = None, self._lexer
        if data is None and token_id not in schema.eos_token_ids:
            return False
        configs = self._configs
        config = configs[0]
        if (
            len(configs) == 1
            and config.field == STRUCT
            and (data is None or token_id not in config.schema._crossing or self._filled is configs)
        ):
            # (a mask filled for these configurations found no field to enter: no token does)
            # the common step: one structural reading, a token that cannot enter a field.
            # Advance xgrammar in place; rollback undoes it with xgrammar's own rollback.
            if not config.matcher.accept_token(token_id):
                return False
            self._history.append((configs, len(self._output), self._lexer, config.matcher))
        else:
            following: list[Configuration] = []
            for config in configs:
                following += config.schema._token(config, token_id, data, self._output)
            if not following:
                return False
            self._history.append((configs, len(self._output), self._lexer, None))
            self._configs = following
        self._lexer = lexer
        self._filled = None  # the state moved: what the last fill found no longer holds
        if data is not None:
            self._output += data
        return True

    def accept_tokens(self, token_ids: Iterable[int]) -> int:
        """Accept tokens in order until one is rejected; returns how many were accepted."""
        if not isinstance(token_ids, Iterable):
            raise ArgumentTypeError(f"token_ids must be an iterable of integers, got {type(token_ids).__name__}")
        accepted = 0
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
            self._configs, length, self._lexer, advanced = self._history.pop()
            if advanced is not None:
                advanced.rollback(1)
            del self._output[length:]
        self._filled = None

    def reset(self) -> None:
        """Return to the start and forget the history."""
        self._configs = self._schema._initial()
        self._history.clear()
        self._output.clear()
        self._lexer = LEX_OUT
        self._filled = None

    def find_jump_forward_string(self) -> str:
        """What every continuation of the output from here begins with (xgrammar's name): text
        a decoding loop may append without asking the model (jump-forward decoding), as its
        longest whole-UTF-8 prefix (``""`` inside a character, as xgrammar answers). Found on a
        fork by the masks themselves, so across the structure, enum values and the boundaries
        between them alike: while EOS is not allowed and every allowed token begins with one
        byte, that byte is forced and the fork takes it as a single-byte token. Stops short of
        the whole forced string (never past it) where the vocabulary has no token for the
        forced byte alone, and after :data:`MAX_JUMP_BYTES`."""
        tables = self._schema._support.jump_tables
        eos = self._schema.eos_token_ids
        probe = self._fork(history=False)
        row = np.zeros((1, self._schema._support.width), dtype=np.int32)
        words = row[0]
        forced = bytearray()
        while len(forced) < MAX_JUMP_BYTES:
            probe.fill_next_token_bitmask(row)
            allowed = np.flatnonzero(words)
            if not len(allowed) or any(int(words[e >> 5]) >> (e & 31) & 1 for e in eos):
                break
            word = int(words[allowed[0]])
            token = 32 * int(allowed[0]) + (word & -word).bit_length() - 1  # the lowest allowed id
            byte = int(tables.first_byte[token])
            if byte < 0 or (words & ~tables.starting[byte]).any():
                break  # (another first byte is allowed too)
            single = int(tables.single[byte])
            if single < 0 or not probe.accept_token(single):
                break
            forced.append(byte)
        return whole_characters(bytes(forced))

    def copy(self) -> SchemaMatcher:
        """An independent matcher in the same state, with the same rollback history."""
        return self._fork(history=True)

    def _fork(self, *, history: bool) -> SchemaMatcher:
        """An independent matcher in the same state, with this one's rollback history or none."""
        forks: dict[int, Any] = {}

        def fork(matcher: Any) -> Any:
            # xgrammar's fork keeps the matcher's own rollback history
            if id(matcher) not in forks:
                forks[id(matcher)] = matcher.fork()
            return forks[id(matcher)]

        def copied(configs: list[Configuration]) -> list[Configuration]:
            return [c._replace(matcher=fork(c.matcher)) for c in configs]

        clone = SchemaMatcher.__new__(SchemaMatcher)
        clone._schema = self._schema
        clone._configs = copied(self._configs)
        clone._history = _new_history(
            (self._history.maxlen or 0) if history else 0,
            (
                (copied(configs), length, lexer, None if advanced is None else fork(advanced))
                for configs, length, lexer, advanced in (self._history if history else ())
            ),
        )
        clone._output = bytearray(self._output)
        clone._lexer = self._lexer
        clone._scratch = np.zeros_like(self._scratch)
        clone._scratch_width = self._scratch_width
        clone._filled = None
        return clone

    def __copy__(self) -> SchemaMatcher:
        return self.copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> SchemaMatcher:
        return self.copy()  # the compiled schema is shared, as by copy()

    def __reduce__(self) -> Any:
        raise TypeError(
            "a SchemaMatcher cannot be pickled (it holds xgrammar matchers); use copy() within a "
            "process, or replay the accepted tokens into a new matcher"
        )

    def is_terminated(self) -> bool:
        """True once EOS was accepted (or the grammar allows nothing more)."""
        return any(c.field == STRUCT and c.matcher.is_terminated() for c in self._configs)

    def allowed_token_ids(self) -> npt.NDArray[np.int32]:
        """Ids allowed next, ascending."""
        row = np.zeros((1, self._schema._support.width), dtype=np.int32)
        self.fill_next_token_bitmask(row)
        return np.flatnonzero(unpack_bitmask(row, self._schema.vocab_size)[0]).astype(np.int32)

    def _fill_reference(self, bitmask: Any, row: int = 0) -> None:
        # fill_next_token_bitmask (the C one defers here for the fills it does not take)
        if (  # the per-step path: as_bitmask_array's checks, inlined
            type(bitmask) is np.ndarray
            and bitmask.dtype == np.int32
            and bitmask.ndim == 2
            and bitmask.shape[1] == self._scratch_width
            and bitmask.flags.c_contiguous
            and bitmask.flags.writeable
            and type(row) is int
            and 0 <= row < bitmask.shape[0]
        ):
            self._fill(bitmask[row])
            return
        array = as_bitmask_array(bitmask, self._schema.vocab_size)
        row = integer(row, "row", StateError, "an integer")
        if not 0 <= row < array.shape[0]:
            raise StateError(f"row {row} is outside the bitmask's {array.shape[0]} rows")
        self._fill(array[row])

    def _fill(self, out: npt.NDArray[np.int32]) -> None:
        before = self._output
        first = self._configs[0]
        entered = first.schema._fill(first, out, self._scratch, before)
        if len(self._configs) > 1:
            other = np.empty_like(out)
            for config in self._configs[1:]:
                entered |= config.schema._fill(config, other, self._scratch, before)
                out |= other
        # strict JSON: no raw control byte inside a string, whatever the structure allows
        np.bitwise_and(out, self._schema._support.lexical.keep[self._lexer], out=out)
        # remembered for accept_token: no field can be entered from these configurations
        self._filled = None if entered else self._configs

    def __repr__(self) -> str:
        return f"SchemaMatcher(output={bytes(self._output)[-40:]!r}, configurations={len(self._configs)})"


_SCHEMA_OF = attrgetter("_schema")


def fill_next_token_bitmasks(
    matchers: Sequence[SchemaMatcher], bitmask: Any, rows: Sequence[int] | None = None
) -> None:
    """Fill one bitmask row per matcher in one call (row ``i`` by default for matcher ``i``).

    The serving-engine entry point: it checks the buffer once and skips the per-call
    checks of :meth:`SchemaMatcher.fill_next_token_bitmask`. With the C extension, the rows
    in the JSON structure go to xgrammar's ``BatchGrammarMatcher`` in one call (its threads),
    and the checks are C's too (anything they do not take is checked here, and raises).
    """
    native = kernels.KERNELS if handles_usable() else None
    if native is not None and native.fill_schema_rows(matchers, bitmask, rows, _batcher()._handle):
        return
    # (checked per distinct type and schema: a batch holds one or a few of each)
    if not isinstance(matchers, Sequence) or not all(issubclass(t, SchemaMatcher) for t in set(map(type, matchers))):
        raise ArgumentTypeError(f"matchers must be a sequence of SchemaMatcher objects, got {matchers!r:.60}")
    if not matchers:
        return
    array = as_bitmask_array(bitmask, matchers[0].schema.vocab_size)
    if rows is None:
        targets = list(range(len(matchers)))
        lowest, highest = 0, len(matchers) - 1
    elif not isinstance(rows, Iterable | np.ndarray):
        raise ArgumentTypeError(f"rows must be a sequence of integers, got {type(rows).__name__}")
    else:
        targets = [integer(r, "rows") for r in rows]
        lowest, highest = min(targets, default=0), max(targets, default=0)
    if len(targets) != len(matchers):
        raise StateError(f"rows must be {len(matchers)} integers (one per matcher), got {len(targets)}")
    if not 0 <= lowest <= highest < array.shape[0]:
        outside = next(t for t in targets if not 0 <= t < array.shape[0])
        raise StateError(f"row {outside} is outside the bitmask's {array.shape[0]} rows")
    schemas = list(map(_SCHEMA_OF, matchers))  # (one schema, most often: counted by identity)
    if schemas.count(schemas[0]) != len(schemas) and len({s.vocab_size for s in schemas}) > 1:
        raise StateError("all matchers of one batch must share a vocabulary size")
    if native is None or not native.fill_schema_rows(list(matchers), array, targets, _batcher()._handle):
        for matcher, target in zip(matchers, targets, strict=True):
            matcher.fill_next_token_bitmask(array, target)


_BATCHERS = threading.local()


def _batcher() -> Any:
    """This thread's xgrammar ``BatchGrammarMatcher`` (its thread pool is not for two
    callers at once)."""
    found = getattr(_BATCHERS, "batcher", None)
    if found is None:
        import xgrammar

        found = _BATCHERS.batcher = xgrammar.BatchGrammarMatcher()
    return found


def allowed_token_bitmask(
    matchers: Sequence[SchemaMatcher | None],
    eos_token_ids: Iterable[int],
    width: int,
    on_error: Callable[[int, Exception], None] | None = None,
) -> npt.NDArray[np.int32]:
    """The allowed tokens of a batch of rows as an int32 bitmask, ``(len(matchers),
    ceil(width / 32))``, for masking logits at once (``width`` may exceed the vocabulary:
    the extra columns are closed).

    A row that is None (a request gone wrong), terminated, or whose fill raises allows
    only EOS, so no row is ever all closed; ``on_error(row, error)`` is told of a fill that
    raised (a tool's arguments compiled on first use), and without it the error propagates.
    """
    eos = np.asarray(list(eos_token_ids), dtype=np.int64)
    live = [i for i, m in enumerate(matchers) if m is not None and not m.is_terminated()]
    vocab_size = matchers[live[0]].schema.vocab_size if live else width  # type: ignore[union-attr]
    words = bitmask_width(vocab_size)
    columns = max(words, bitmask_width(width))
    # the live rows in one batch (the C steps, xgrammar's BatchGrammarMatcher), in a buffer of
    # their own width when the logits are wider than the vocabulary
    bitmask = np.zeros((len(matchers), columns), dtype=np.int32)
    rows = bitmask if columns == words else np.zeros((len(matchers), words), dtype=np.int32)
    filled = live
    try:
        fill_next_token_bitmasks([matchers[i] for i in live], rows, live)  # type: ignore[misc]
    except Exception:  # a fill raised (a tool's arguments compiled on first use): row by row
        filled = []
        for i in live:
            try:
                matchers[i].fill_next_token_bitmask(rows, i)  # type: ignore[union-attr]
                filled.append(i)
            except Exception as error:  # noqa: PERF203 - any failure closes that row alone
                if on_error is None:
                    raise
                on_error(i, error)
                rows[i] = 0
    if rows is not bitmask:
        bitmask[:, :words] = rows
    if vocab_size > width:  # columns past the logits' width: closed
        bitmask[:, width >> 5] &= (1 << (width & 31)) - 1 if width & 31 else 0
        bitmask[:, (width + 31) >> 5 :] = 0
    ended = np.setdiff1d(np.arange(len(matchers)), np.asarray(filled, dtype=np.int64))
    eos = eos[eos < width]
    for row in ended.tolist():
        np.bitwise_or.at(
            bitmask[row].view(np.uint32), eos >> 5, np.left_shift(np.uint32(1), (eos & 31).astype(np.uint32))
        )
    return bitmask


def allowed_token_rows(
    matchers: Sequence[SchemaMatcher | None],
    eos_token_ids: Iterable[int],
    width: int,
    on_error: Callable[[int, Exception], None] | None = None,
) -> npt.NDArray[np.bool_]:
    """:func:`allowed_token_bitmask` as booleans, ``(len(matchers), width)``."""
    return unpack_bitmask(allowed_token_bitmask(matchers, eos_token_ids, width, on_error), width)
