"""Exceptions raised by triemask.

Every error triemask raises on bad input derives from :class:`TriemaskError`, and
also from the built-in class a caller would naturally catch (``ValueError``,
``TypeError`` or ``IndexError``)::

    TriemaskError
    ├── VocabularyError (ValueError)       a token table, EOS id, vocab_size or tokenizer file is unusable
    ├── ValueSetError (ValueError)         the set of values to compile is unusable
    │   ├── IncompatibleValueError         a value no sequence of text tokens can spell
    │   └── MemoryLimitError               the automaton would exceed compile(max_bytes=...)
    ├── PatternError (ValueError)          a regex triemask cannot compile; .position is the offending offset
    │   └── UnboundedPatternError          *, + or {n,}: an infinite language, for the structural engine
    ├── SchemaError (ValueError)           a JSON schema or tool list that cannot be compiled; .path names
    │                                      the field ("$.properties.name.enum[3]")
    ├── StateError (ValueError)            a state id that no automaton state has (also a bool or
    │                                      float where a state, row or token id is due)
    ├── BitmaskError (ValueError)          a bitmask or logits buffer of the wrong shape, dtype or device
    ├── AutomatonFileError (ValueError)    a saved automaton that cannot be loaded: truncated, corrupt,
    │                                      a newer format, another vocabulary; .field names what
    ├── ArgumentTypeError (TypeError)      an argument of the wrong kind (Compiler("x"), Matcher(42))
    └── ValueIndexError (IndexError)       TrieAutomaton.value(i) with i outside [0, num_values)

A token that is merely not allowed is not an error: ``TrieAutomaton.next_state``
returns :data:`triemask.DEAD` and ``Matcher.accept_token`` returns ``False``.

What triemask compiles but does not enforce is a warning, never silent::

    TriemaskWarning (UserWarning)
    └── UnenforcedSchemaWarning            a schema keyword the structural engine (xgrammar) does not
                                           enforce (not, if/then/else, uniqueItems, ...), compiled as
                                           xgrammar compiles it; .paths names each, in schema order
"""

from __future__ import annotations

import operator
from typing import Any


class TriemaskError(Exception):
    """Base class of every error raised by triemask."""


class VocabularyError(TriemaskError, ValueError):
    """A token table, EOS id, ``vocab_size`` or tokenizer cannot be used."""


class ValueSetError(TriemaskError, ValueError):
    """The set of values handed to ``Compiler.compile`` cannot be compiled."""


class MemoryLimitError(ValueSetError):
    """The set's automaton would take more memory than the caller allowed
    (``Compiler.compile(values, max_bytes=...)``), found before the large allocations.

    Attributes
    ----------
    limit : int
        The ``max_bytes`` given.
    needed : int
        The bytes known to be needed when compilation stopped (a lower bound when it
        stopped early).
    """

    def __init__(self, message: str, *, limit: int, needed: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.needed = needed


class IncompatibleValueError(ValueSetError):
    """A value that no sequence of the vocabulary's text tokens can spell.

    Attributes
    ----------
    value : str | bytes
        The offending value, as given.
    offset : int
        Byte offset inside the value's UTF-8 encoding where spelling fails.
    """

    def __init__(self, message: str, *, value: str | bytes, offset: int) -> None:
        super().__init__(message)
        self.value = value
        self.offset = offset


class SchemaError(TriemaskError, ValueError):
    """A JSON schema or tool list that cannot be compiled.

    Attributes
    ----------
    path : str
        Where in the schema (or tool list) the problem is, in JSONPath style:
        ``$.properties.name.enum[3]``, ``$[2].function.name``.
    """

    def __init__(self, message: str, *, path: str = "$") -> None:
        super().__init__(message)
        self.path = path


class PatternError(TriemaskError, ValueError):
    """A regular expression triemask cannot compile (malformed, unsupported, too large).

    Attributes
    ----------
    pattern : str
        The pattern.
    position : int
        Character offset in ``pattern`` where the problem is.
    """

    def __init__(self, message: str, *, pattern: str, position: int) -> None:
        super().__init__(f"{message} at position {position} of {pattern!r:.200}")
        self.pattern = pattern
        self.position = position


class UnboundedPatternError(PatternError):
    """A pattern whose language is infinite (``*``, ``+``, ``{n,}``): it needs the
    structural engine (``xgrammar.GrammarCompiler.compile_regex``), not a finite automaton."""


class StateError(TriemaskError, ValueError):
    """A state id outside the automaton (neither a node, a final state, nor DEAD)."""


class BitmaskError(TriemaskError, ValueError):
    """A token bitmask (or logits) buffer whose type, shape, dtype, layout or device is wrong."""


class AutomatonFileError(TriemaskError, ValueError):
    """A saved automaton cannot be loaded (``TrieAutomaton.load``): the file is truncated,
    corrupt, not a triemask file, of a newer format, or compiled for another vocabulary.
    ``field`` names what is wrong (``"size"``, ``"header"``, ``"format_version"``,
    ``"vocab_fingerprint"``, an array's name, ...)."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


class ArgumentTypeError(TriemaskError, TypeError):
    """An argument of the wrong kind: a string where a :class:`~triemask.Vocabulary` is due,
    a float where a count is due."""


class ValueIndexError(TriemaskError, IndexError):
    """A value index outside ``[0, num_values)`` (``TrieAutomaton.value``)."""


def integer(value: Any, what: str, error: type[TriemaskError] = StateError, expected: str = "integers") -> int:
    """``value`` as an ``int``; bools, floats and other non-integers raise ``error``
    naming ``what`` (numpy integers are integers; nothing is truncated)."""
    if type(value) is int:  # the common case; bool is a subclass of int and fails this test
        return value
    if not isinstance(value, bool) and type(value).__name__ != "bool_":
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise error(f"{what} must be {expected}, got {type(value).__name__} {value!r:.40}")


class TriemaskWarning(UserWarning):
    """Base class of every warning triemask issues."""


class UnenforcedSchemaWarning(TriemaskWarning):
    """A schema holds keywords the structural engine (xgrammar) accepts but does not enforce:
    it was compiled as xgrammar compiles it, and the output may break them.
    (``compile_json_schema(..., unsupported="error")`` refuses such a schema instead.)

    Attributes
    ----------
    paths : tuple of str
        Each keyword's path (``"$.properties.tags.uniqueItems"``), in the schema's order.
    """

    def __init__(self, message: str, *, paths: tuple[str, ...]) -> None:
        super().__init__(message)
        self.paths = paths
