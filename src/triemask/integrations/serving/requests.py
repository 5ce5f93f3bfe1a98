"""Requests read and priced before any work that grows with them."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ...base import PatternError, TriemaskError
from ...schemas import (
    DEFAULT_MIN_ENUM_VALUES,
    DEFAULT_MIN_UNION_BRANCHES,
    TOO_DEEP,
    StructureCost,
    dispatch,
    dispatched_cost,
    load_schema,
    read_tools,
    structure_cost,
)
from ...sets import FORMATS, dag_of_pattern
from ...sets import literal_alternatives as regex_literals
from .limits import (
    FORMAT_ARG,
    MAX_PATTERN_BYTES_ENV,
    MAX_SCHEMA_COST_ENV,
    MAX_SET_BYTES_ENV,
    MAX_VALUE_BYTES_ENV,
    MAX_VALUES_ENV,
    REGEX_ARG,
    REQUEST_ARGS,
    SCHEMA_ARG,
    SET_ARG,
    TOOLS_ARG,
    VALUES_ARG,
    Limits,
    RequestError,
)
from .registry import registered_sets


def requested_values(extra_args: Mapping[str, Any] | None, limits: Limits | None = None) -> list[str] | None:
    """The set a request asks for, or None when it asks for none.

    Every check that does not need the model's vocabulary is made here: types, the
    :class:`Limits` (``Limits.from_env()`` by default), valid Unicode (no lone
    surrogates) and the registered set's name. Raises :class:`RequestError` naming the
    field, so engines reject the request (HTTP 400) before it is scheduled.
    """
    if not extra_args:
        return None
    if not isinstance(extra_args, Mapping):
        raise RequestError(f"extra_args must be a mapping, got {type(extra_args).__qualname__}")
    given = [arg for arg in REQUEST_ARGS if extra_args.get(arg) is not None]
    if len(given) > 1:
        raise RequestError(f"give one triemask argument per request, not both {' and '.join(map(repr, given[:2]))}")
    values, name = extra_args.get(VALUES_ARG), extra_args.get(SET_ARG)
    if values is None and name is None:
        return None
    if name is not None:
        if not isinstance(name, str):
            raise RequestError(f"{SET_ARG!r} must be a set name (a string), got {type(name).__qualname__}")
        try:
            sets = registered_sets()
        except ValueError:
            raise RequestError(f"{SET_ARG!r}: the server's registered sets could not be loaded") from None
        if name not in sets:  # other sets' names are the operator's business, not the client's
            raise RequestError(f"{SET_ARG!r}: unknown set {name[:100]!r}")
        return sets[name]
    if isinstance(values, str) or not isinstance(values, Sequence) or not values:
        raise RequestError(f"{VALUES_ARG!r} must be a non-empty list of strings, got {values!r:.80}")
    limits = Limits.from_env() if limits is None else limits
    if len(values) > limits.max_values:
        raise RequestError(
            f"{VALUES_ARG!r} holds {len(values)} values, more than the server's limit of {limits.max_values} "
            f"(${MAX_VALUES_ENV})"
        )
    total = 0
    for index, value in enumerate(values):
        if not isinstance(value, str):
            raise RequestError(
                f"{VALUES_ARG!r} must be a list of strings; item {index} is {type(value).__qualname__} {value!r:.40}"
            )
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError as error:
            raise RequestError(
                f"{VALUES_ARG!r}: item {index} is not valid Unicode ({error.reason} at character {error.start})"
            ) from None
        if size > limits.max_value_bytes:
            raise RequestError(
                f"{VALUES_ARG!r}: item {index} has {size} UTF-8 bytes, more than the server's limit of "
                f"{limits.max_value_bytes} (${MAX_VALUE_BYTES_ENV})"
            )
        total += size
        if total > limits.max_set_bytes:
            raise RequestError(
                f"{VALUES_ARG!r}: the values exceed the server's limit of {limits.max_set_bytes} UTF-8 bytes "
                f"per set (${MAX_SET_BYTES_ENV}) at item {index}"
            )
    return list(values)


@dataclass(frozen=True)
class SchemaRequest:
    """A request's JSON schema or tool list, as canonical JSON text (the cache key)."""

    kind: str  # SCHEMA_ARG or TOOLS_ARG
    text: str


logger = logging.getLogger("triemask")


def engine_dispatch(
    schema: dict[str, Any], *, patterns: bool = True
) -> tuple[dict[str, Any], list[Any], tuple[str, ...]]:
    """:func:`~triemask.schemas.dispatch` at the thresholds every engine adapter compiles with
    (enums of ``DEFAULT_MIN_ENUM_VALUES`` values, unions of ``DEFAULT_MIN_UNION_BRANCHES``
    branches): one reading for vLLM's admission, its structured-output backend and SGLang's."""
    return dispatch(schema, DEFAULT_MIN_ENUM_VALUES, min_union_branches=DEFAULT_MIN_UNION_BRANCHES, patterns=patterns)


@lru_cache(maxsize=1024)  # once per list of paths: a server sees the same tools again and again
def log_unenforced(paths: tuple[str, ...]) -> None:
    """One log line for a schema or tool list served with keywords xgrammar does not enforce
    (the standard engine serves them too: a drop-in does not refuse them)."""
    logger.warning(
        "triemask: serving a schema whose %s the structural engine (xgrammar) does not enforce: %s",
        "keyword" if len(paths) == 1 else f"{len(paths)} keywords",
        ", ".join(paths[:8]) + (", ..." if len(paths) > 8 else ""),
    )


def requested_schema(extra_args: Mapping[str, Any] | None, limits: Limits | None = None) -> SchemaRequest | None:
    """The JSON schema or tool list a request asks for, or None.

    Checked here, without the vocabulary: the type, the size (the JSON text within
    ``$TRIEMASK_MAX_SET_BYTES``), that a schema is a JSON object, that tools are
    function specs with distinct names, and that no enum is empty. Raises
    :class:`RequestError` naming the field (HTTP 400).
    """
    if not extra_args or not isinstance(extra_args, Mapping):
        return None
    kind = next((arg for arg in (SCHEMA_ARG, TOOLS_ARG) if extra_args.get(arg) is not None), None)
    if kind is None:
        return None

    given = extra_args[kind]
    limits = Limits.from_env() if limits is None else limits

    def priced(text: str) -> str:  # the size, before any work that grows with it
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > limits.max_set_bytes:
            raise RequestError(
                f"{kind!r} has {size} bytes of JSON, more than the server's limit of {limits.max_set_bytes} "
                f"(${MAX_SET_BYTES_ENV})"
            )
        return text

    try:
        if isinstance(given, str):
            priced(given)
        else:  # the engine's request holds it parsed: its text, bounded by the same limit
            priced(json.dumps(given, sort_keys=True, ensure_ascii=False))
        if kind == SCHEMA_ARG:
            if not isinstance(given, str | Mapping):
                raise RequestError(
                    f"{kind!r} must be a JSON schema (an object or its JSON text), got {type(given).__qualname__}"
                )
            loaded: Any = load_schema(given)
            # empty enums and bad values, with their paths (no pattern automaton: those are the
            # engine's, so this front end's event loop never waits on one), and what the
            # engine's compile gives xgrammar (enums and unions at the engine's thresholds)
            structural, sites, _ = engine_dispatch(loaded, patterns=False)
            _price_structure(kind, "$", dispatched_cost(loaded, structural, sites), limits)
        else:
            if isinstance(given, str):
                given = json.loads(given)
            unenforced: list[str] = []
            for index, (_, parameters) in enumerate(read_tools(given)):
                try:
                    _, _, found = dispatch(load_schema(parameters), 1, patterns=False)  # (depth bounded)
                    # (one tool at a time: its arguments compile when it is chosen)
                    _price_structure(kind, f"$[{index}].parameters", structure_cost(parameters), limits)
                except TriemaskError as error:
                    path = f"$[{index}].parameters" + getattr(error, "path", "$")[1:]
                    raise RequestError(f"{kind!r} at {path}: {error}") from None
                unenforced += (f"$[{index}].parameters{path[1:]}" for path in found)
            if unenforced:  # (a tool's arguments compile in the engine's step: reported here, once)
                log_unenforced(tuple(unenforced))
            loaded = given
        # in its own key order: xgrammar emits properties in the order given, so order is language
        text = priced(json.dumps(loaded, ensure_ascii=False))
    except RequestError:
        raise
    except RecursionError:
        raise RequestError(f"{kind!r}: {TOO_DEEP} (beyond Python's recursion limit)") from None
    except (TriemaskError, ValueError, TypeError) as error:
        where = getattr(error, "path", None)
        raise RequestError(f"{kind!r}{'' if where is None else ' at ' + where}: {error}") from None
    return SchemaRequest(kind, text)


def _price_structure(kind: str, path: str, cost: StructureCost, limits: Limits) -> None:
    """Refuse a schema whose structure would cost the engine's step more than the limit."""
    if cost.milliseconds > limits.max_schema_cost_ms:
        raise RequestError(
            f"{kind!r} at {path} would take the structural engine about {cost.milliseconds:,.0f} ms to compile, "
            f"more than the server's limit of {limits.max_schema_cost_ms:,} ms (${MAX_SCHEMA_COST_ENV}): it holds "
            f"{cost.patterns} patterns (about 450 ms each), {cost.formats} formats (20 ms each), and objects "
            f"whose optional properties cost {0.006 * cost.optional_squares:,.0f} ms"
        )


@dataclass(frozen=True)
class PatternRequest:
    """A request's finite regex (a format is its pattern), checked at admission."""

    kind: str  # REGEX_ARG or FORMAT_ARG
    pattern: str


def requested_pattern(extra_args: Mapping[str, Any] | None, limits: Limits | None = None) -> PatternRequest | None:
    """The finite regex or format a request asks for, or None.

    The pattern's byte automaton does not depend on the vocabulary, so it is checked here:
    the type, the size (within ``$TRIEMASK_MAX_PATTERN_BYTES``, before any parsing), the
    format's name, and that the pattern parses, is finite and stays within the automaton
    limits (about 0.06 s of work at most). What the vocabulary adds is bounded when the
    engine compiles it (``$TRIEMASK_MAX_AUTOMATON_BYTES``). Raises :class:`RequestError`
    naming the field and the offending position (HTTP 400).
    """
    if not extra_args or not isinstance(extra_args, Mapping):
        return None
    kind = next((arg for arg in (REGEX_ARG, FORMAT_ARG) if extra_args.get(arg) is not None), None)
    if kind is None:
        return None

    given = extra_args[kind]
    limits = Limits.from_env() if limits is None else limits
    if not isinstance(given, str):
        raise RequestError(f"{kind!r} must be a string, got {type(given).__qualname__} {given!r:.40}")
    if kind == FORMAT_ARG:
        if given not in FORMATS:
            raise RequestError(f"{kind!r}: unknown format {given!r:.60}; the built-in formats are {', '.join(FORMATS)}")
        return PatternRequest(kind, FORMATS[given])
    size = len(given.encode("utf-8", "surrogatepass"))
    if size > limits.max_pattern_bytes:
        raise RequestError(
            f"{kind!r} has {size} bytes, more than the server's limit of {limits.max_pattern_bytes} "
            f"(${MAX_PATTERN_BYTES_ENV})"
        )
    try:
        dag_of_pattern(given)
    except PatternError as error:
        raise RequestError(f"{kind!r}: {error}") from None
    return PatternRequest(kind, given)


def validate_request(extra_args: Any, limits: Limits | None = None) -> None:
    """Every admission check of a request's triemask arguments (raises RequestError)."""
    requested_values(extra_args, limits)
    requested_schema(extra_args, limits)
    requested_pattern(extra_args, limits)


def literal_alternatives(kind: str, text: str) -> list[str] | None:
    """The strings of a grammar that is only an alternation of literals, else None.

    ``kind`` is ``"regex"`` (``yes|no``, ``^(?:yes|no)$``, metacharacters escaped: read by
    the library's regex reader, :func:`triemask.sets.literal_alternatives`) or ``"ebnf"``
    (``root ::= "yes" | "no"``, JSON string escapes). Anything else (a character class, a
    repetition, a second rule) returns None: it is not a finite set of literals.
    """
    if kind == "regex":
        return regex_literals(text)
    if kind == "ebnf":
        return _ebnf_alternatives(text)
    return None


_EBNF_RULE = re.compile(r"\s*root\s*::=\s*(.*?)\s*", re.DOTALL)
_EBNF_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"\s*(\||$)', re.DOTALL)


def _ebnf_alternatives(grammar: str) -> list[str] | None:
    rule = _EBNF_RULE.fullmatch(grammar)
    if rule is None:
        return None
    body, values, position = rule.group(1), [], 0
    while position < len(body):
        literal = _EBNF_STRING.match(body, position)
        if literal is None:
            return None
        try:
            values.append(json.loads(f'"{literal.group(1)}"'))
        except json.JSONDecodeError:
            return None
        position = literal.end()
        position += len(body[position:]) - len(body[position:].lstrip())
        if literal.group(2) == "|" and position >= len(body):
            return None  # a trailing "|"
    return values or None
