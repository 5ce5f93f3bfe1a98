"""What the serving-engine adapters (vLLM, SGLang) share, free of any engine import.

- the per-request arguments: ``triemask_values`` (a list of strings) or ``triemask_set``
  (the name of a set registered at server start from ``$TRIEMASK_SETS``), checked at
  admission against the operator's limits (:class:`Limits`), so a malformed or oversize
  request is an HTTP 400 naming the field;
- a byte-bounded LRU of compiled sets keyed by content hash, each with its arrays
  uploaded to the engine's device once (:class:`~triemask.integrations.torch.DeviceAutomaton`);
  registered sets are compiled at start-up and never evicted; a set that fails to
  compile (a value the vocabulary cannot spell, the edge-key limit, memory) is
  remembered as failed;
- the per-row bookkeeping: a row's state advanced from its output tokens, and all rows
  of one set masked with one device operation. A request whose set failed to compile
  (or whose output ids are unusable) is ended alone: its row allows only EOS, an error
  is logged, and the rest of the batch goes on. Nothing here raises out of an engine step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._automaton import TrieAutomaton
from .._cache import CompileCache
from .._compile import Compiler
from .._errors import AutomatonFileError, ValueSetError
from .._mixed import CompiledSchema, SchemaMatcher, allowed_token_rows, prepare_schemas
from .._schema import structure_cost
from .._storage import read_regular_file
from .._vocabulary import Vocabulary

logger = logging.getLogger("triemask")

VALUES_ARG = "triemask_values"
SET_ARG = "triemask_set"
SCHEMA_ARG = "triemask_json_schema"  # a JSON schema (object or JSON text): enum fields in tries
TOOLS_ARG = "triemask_tools"  # OpenAI-style function specs: {"name": ..., "arguments": ...}
REGEX_ARG = "triemask_regex"  # a regex with a finite language (no * or +): its acyclic automaton
FORMAT_ARG = "triemask_format"  # a built-in format: date, time, date-time, uuid, ipv4, ipv6
_ARGS = (VALUES_ARG, SET_ARG, SCHEMA_ARG, TOOLS_ARG, REGEX_ARG, FORMAT_ARG)
SETS_ENV = "TRIEMASK_SETS"  # a file (one set) or a folder of *.txt files (one set each)
CACHE_BYTES_ENV = "TRIEMASK_CACHE_BYTES"
DEFAULT_CACHE_BYTES = 1 << 30
MAX_VALUES_ENV = "TRIEMASK_MAX_VALUES"
MAX_VALUE_BYTES_ENV = "TRIEMASK_MAX_VALUE_BYTES"
MAX_SET_BYTES_ENV = "TRIEMASK_MAX_SET_BYTES"
MAX_PATTERN_BYTES_ENV = "TRIEMASK_MAX_PATTERN_BYTES"
MAX_AUTOMATON_BYTES_ENV = "TRIEMASK_MAX_AUTOMATON_BYTES"
MAX_SCHEMA_COST_ENV = "TRIEMASK_MAX_SCHEMA_COST_MS"


class RequestError(ValueError):
    """A request's triemask arguments are unusable; the message names the field (HTTP 400)."""


@dataclass(frozen=True)
class Limits:
    """What one request may ask for (registered sets are the operator's and are not
    limited). The defaults bound the compile a request can cause to about a second on a
    2-core machine (docs/serving.md, "Limits"); an operator sets them with
    ``$TRIEMASK_MAX_VALUES``, ``$TRIEMASK_MAX_VALUE_BYTES``, ``$TRIEMASK_MAX_SET_BYTES`` (UTF-8
    bytes of a set, a schema or a tool list), ``$TRIEMASK_MAX_PATTERN_BYTES`` (a regex, checked
    before it is parsed), ``$TRIEMASK_MAX_AUTOMATON_BYTES`` (the automaton a regex compiles
    to for the model's vocabulary: ``.{0,1000}`` is 9 bytes and would take gigabytes) and
    ``$TRIEMASK_MAX_SCHEMA_COST_MS`` (the structural engine's compile of a schema, or of one
    tool's parameters, estimated from what it holds: :func:`triemask._schema.structure_cost`)."""

    max_values: int = 100_000
    max_value_bytes: int = 1024
    max_set_bytes: int = 1 << 20
    max_pattern_bytes: int = 4096
    max_automaton_bytes: int = 16 << 20
    max_schema_cost_ms: int = 2000

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Limits:
        """The limits set in the environment (defaults where unset); a malformed
        setting raises ``ValueError`` naming the variable (at start-up)."""
        environ = os.environ if environ is None else environ
        values: dict[str, int] = {}
        for field, name in (
            ("max_values", MAX_VALUES_ENV),
            ("max_value_bytes", MAX_VALUE_BYTES_ENV),
            ("max_set_bytes", MAX_SET_BYTES_ENV),
            ("max_pattern_bytes", MAX_PATTERN_BYTES_ENV),
            ("max_automaton_bytes", MAX_AUTOMATON_BYTES_ENV),
            ("max_schema_cost_ms", MAX_SCHEMA_COST_ENV),
        ):
            raw = environ.get(name)
            if raw is None:
                continue
            try:
                values[field] = int(raw)
            except ValueError:
                raise ValueError(f"${name}={raw!r} is not an integer") from None
            if values[field] <= 0:
                raise ValueError(f"${name}={raw!r} must be positive")
        return cls(**values)


MAX_SET_FILE_BYTES = 1 << 30  # a registered set's file: larger ones (or a link to /dev/zero) are refused


def _read_set_file(file: Path) -> list[str]:
    """One value per line: strict UTF-8 (a leading byte-order mark dropped), lines
    split at ``\n`` or ``\r\n`` only (a value may hold any other character). Only a
    regular file of at most :data:`MAX_SET_FILE_BYTES` is read (a FIFO would block the
    reader, a device would never end), opened without blocking."""
    try:
        raw = read_regular_file(file, str(file), max_bytes=MAX_SET_FILE_BYTES)
    except AutomatonFileError as error:
        raise ValueError(f"{SETS_ENV}: {error}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{SETS_ENV}: {file} is not UTF-8: byte 0x{raw[error.start]:02x} at offset {error.start}"
        ) from None
    text = text.removeprefix("\ufeff")
    values = [line.removesuffix("\r") for line in text.split("\n")]
    return [value for value in values if value]


def load_sets(path: str | os.PathLike[str]) -> dict[str, list[str]]:
    """Named sets from a file (one value per line, named by the file's stem) or a folder
    of ``*.txt`` such files. Empty lines are skipped. Raises ``ValueError`` naming the
    file for anything unusable."""
    root = Path(path)
    if not root.exists():
        raise ValueError(f"{SETS_ENV}={str(path)!r}: no such file or folder")
    files = sorted(root.glob("*.txt")) if root.is_dir() else [root]
    if not files:
        raise ValueError(f"{SETS_ENV}={str(path)!r}: the folder holds no *.txt file")
    sets = {}
    for file in files:
        try:
            values = _read_set_file(file)
        except OSError as error:
            raise ValueError(f"{SETS_ENV}: cannot read {file}: {error.strerror}") from None
        if not values:
            raise ValueError(f"{SETS_ENV}: {file} holds no value")
        sets[file.stem] = values
    return sets


_REGISTERED: dict[str, list[str]] | Exception | None = None
_REGISTERED_LOCK = threading.Lock()
_REGISTERED_STATE: dict[str, Any] = {"signature": None, "checked": 0.0, "generation": 0}
RELOAD_SECONDS = 2.0  # how often the registered sets' files are looked at for changes


def _signature(path: str) -> tuple[tuple[str, int, int], ...] | None:
    """The registered files' names, modification times and sizes (None when unreadable)."""
    root = Path(path)
    try:
        files = sorted(root.glob("*.txt")) if root.is_dir() else [root]
        return tuple((f.name, f.stat().st_mtime_ns, f.stat().st_size) for f in files)
    except OSError:
        return None


def registered_sets() -> dict[str, list[str]]:
    """The sets named by ``$TRIEMASK_SETS`` (empty when unset).

    Read at the first call; a failure then is kept and raised again without reading again
    (the server does not start). After that, the files are looked at every
    :data:`RELOAD_SECONDS`: a set whose file changed (or a file added or removed) is read
    again, so a set is updated by name without a restart; a change that cannot be read
    keeps the previous sets and is logged."""
    global _REGISTERED
    with _REGISTERED_LOCK:
        path = os.environ.get(SETS_ENV)
        if _REGISTERED is None:
            try:
                _REGISTERED = load_sets(path) if path else {}
                _REGISTERED_STATE["signature"] = _signature(path) if path else None
            except ValueError as error:
                _REGISTERED = error
            _REGISTERED_STATE["checked"] = time.monotonic()
        due = (
            path
            and not isinstance(_REGISTERED, Exception)
            and (time.monotonic() - float(_REGISTERED_STATE["checked"] or 0.0) >= RELOAD_SECONDS)
        )
        if due:  # one caller looks (the others serve the current sets meanwhile)
            _REGISTERED_STATE["checked"] = time.monotonic()
        current = _REGISTERED
    if due:
        _reload(str(path))  # reading files happens outside the lock: admission never waits on a disk
        with _REGISTERED_LOCK:
            current = _REGISTERED
    if isinstance(current, Exception):
        raise current
    return current


def _reload(path: str) -> None:
    """Read the registered sets again if their files changed (outside the registry lock)."""
    global _REGISTERED
    signature = _signature(path)
    with _REGISTERED_LOCK:
        if signature is None or signature == _REGISTERED_STATE["signature"]:
            return
    try:
        loaded = load_sets(path)
    except ValueError as error:  # keep serving the previous sets
        with _REGISTERED_LOCK:
            _REGISTERED_STATE["signature"] = signature
        logger.warning("triemask: registered sets not reloaded, the previous ones stay: %s", error)
        return
    with _REGISTERED_LOCK:
        _REGISTERED = loaded
        _REGISTERED_STATE["signature"] = signature
        _REGISTERED_STATE["generation"] = int(_REGISTERED_STATE["generation"] or 0) + 1
    logger.info("triemask: registered sets reloaded (%s)", ", ".join(sorted(loaded)))


def registered_generation() -> int:
    """How many times the registered sets were reloaded (0 until a file changes)."""
    with _REGISTERED_LOCK:
        return int(_REGISTERED_STATE["generation"] or 0)


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
    given = [arg for arg in _ARGS if extra_args.get(arg) is not None]
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
    from .._errors import TriemaskError
    from .._schema import TOO_DEEP, dispatch, load_schema
    from .._tools import read_tools

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
            # empty enums, bad values and unenforced keywords, with their paths (no pattern
            # automaton: those are the engine's, so this front end's event loop never waits on one)
            dispatch(loaded, 1, patterns=False)
            _price_structure(kind, "$", loaded, limits)
        else:
            if isinstance(given, str):
                given = json.loads(given)
            for index, (_, parameters) in enumerate(read_tools(given)):
                try:
                    dispatch(load_schema(parameters), 1, patterns=False)  # (load_schema bounds its depth)
                    _price_structure(kind, f"$[{index}].parameters", parameters, limits)  # one tool at a time
                except TriemaskError as error:  # noqa: PERF203 - the error path
                    path = f"$[{index}].parameters" + getattr(error, "path", "$")[1:]
                    raise RequestError(f"{kind!r} at {path}: {error}") from None
            loaded = given
        text = priced(json.dumps(loaded, sort_keys=True, ensure_ascii=False))
    except RequestError:
        raise
    except RecursionError:
        raise RequestError(f"{kind!r}: {TOO_DEEP} (beyond Python's recursion limit)") from None
    except (TriemaskError, ValueError, TypeError) as error:
        where = getattr(error, "path", None)
        raise RequestError(f"{kind!r}{'' if where is None else ' at ' + where}: {error}") from None
    return SchemaRequest(kind, text)


def _price_structure(kind: str, path: str, schema: Any, limits: Limits) -> None:
    """Refuse a schema whose structure would cost the engine's step more than the limit."""
    cost = structure_cost(schema)
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
    from .._errors import PatternError
    from .._regex import FORMATS, dag_of_pattern

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


_REGEX_META = frozenset(".^$*+?{}[]\\|()")
_REGEX_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}


def literal_alternatives(kind: str, text: str) -> list[str] | None:
    """The strings of a grammar that is only an alternation of literals, else None.

    ``kind`` is ``"regex"`` (``yes|no``, ``^(?:yes|no)$``, metacharacters escaped) or
    ``"ebnf"`` (``root ::= "yes" | "no"``, JSON string escapes). Anything else (a
    character class, a repetition, a second rule) returns None: it is not a finite set.
    """
    if kind == "regex":
        return _regex_alternatives(text)
    if kind == "ebnf":
        return _ebnf_alternatives(text)
    return None


def _regex_alternatives(pattern: str) -> list[str] | None:
    body = pattern.removeprefix("^")
    if body.endswith("$") and not body.endswith("\\$"):
        body = body[:-1]
    for opener in ("(?:", "("):
        if body.startswith(opener) and body.endswith(")") and not body.endswith("\\)"):
            body = body[len(opener) : -1]  # an inner unescaped parenthesis is rejected below
            break
    values: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(body):
        char = body[i]
        if char == "\\":
            escaped = body[i + 1 : i + 2]
            if escaped in _REGEX_ESCAPES:
                current.append(_REGEX_ESCAPES[escaped])
            elif escaped == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", body[i + 2 : i + 6]):
                current.append(chr(int(body[i + 2 : i + 6], 16)))
                i += 4
            elif escaped and not escaped.isalnum():
                current.append(escaped)  # an escaped metacharacter or punctuation
            else:
                return None  # \d, \w, a back-reference...: not a literal
            i += 2
        elif char == "|":
            values.append("".join(current))
            current = []
            i += 1
        elif char in _REGEX_META:
            return None
        else:
            current.append(char)
            i += 1
    values.append("".join(current))
    return values


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


@dataclass
class CompiledSet:
    """One compiled set, with its arrays on the engine's device (or a compiled JSON
    schema or tool list, whose rows are masked from host bitmasks)."""

    automaton: TrieAutomaton | None
    device_automaton: Any  # triemask.integrations.torch.DeviceAutomaton
    nbytes: int
    schema: CompiledSchema | None = None


class SetCompileError(Exception):
    """A set that could not be compiled for the engine's vocabulary (kept as such)."""


class CompiledSets:
    """Compile sets on first sight, through the core :class:`~triemask.CompileCache`
    (bounded in bytes, keyed by vocabulary and set fingerprint: a set reordered or with
    duplicates is one entry), with each set's arrays on the engine's device.

    Parameters
    ----------
    compiler : Compiler
        The per-tokenizer index of the engine's model.
    device : torch.device
        Where each set's arrays go.
    max_bytes : int, optional
        Bound on the bytes held (host + device); default ``$TRIEMASK_CACHE_BYTES`` or 1 GiB.
        A set in use by a request stays alive through that request even when evicted.
        Pinned sets (:meth:`pin`, the registered ones) are held outside the bound.
    limits : Limits, optional
        The request limits (default ``Limits.from_env()``): a regex's automaton is compiled
        within ``max_automaton_bytes``.
    """

    _MAX_FAILURES = 1024  # failed sets remembered (their keys and messages only)

    def __init__(
        self, compiler: Compiler, device: Any, max_bytes: int | None = None, limits: Limits | None = None
    ) -> None:
        self.compiler = compiler
        self.limits = Limits.from_env() if limits is None else limits
        self.device = device
        self.cache = CompileCache(max_bytes)
        self._pinned: dict[Any, CompiledSet] = {}
        self._failures: OrderedDict[Any, str] = OrderedDict()
        self._lock = threading.Lock()
        self._ended: CompiledSet | None = None
        self._generation = 0  # of the registered sets pinned here
        self._registered_keys: set[Any] | None = None  # their keys, once a reload made them differ

    @property
    def max_bytes(self) -> int:
        return self.cache.max_bytes

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached sets (the pinned ones excluded)."""
        return int(self.cache.stats()["bytes"])

    # What an entry holds besides its arrays (Python and tensor objects, allocator slack):
    # measured at about 20 KiB per set in resident memory, 7x the arrays of a small set.
    ENTRY_OVERHEAD = 24 << 10

    def _key(self, request: Sequence[str] | SchemaRequest | PatternRequest) -> tuple[Any, ...]:
        vocab = self.compiler.vocab.fingerprint
        if isinstance(request, SchemaRequest):
            return ("schema", vocab, request.kind, request.text)
        if isinstance(request, PatternRequest):
            return ("regex", vocab, request.pattern, str(self.device))
        return ("set", vocab, self.cache.set_key(self.compiler, request), str(self.device))

    def _compile(self, values: Sequence[str] | PatternRequest) -> CompiledSet:
        """A set (or a finite pattern) compiled, with its arrays on the device."""
        from .torch import DeviceAutomaton

        automaton: TrieAutomaton
        if isinstance(values, PatternRequest):  # bounded: a short pattern can ask for gigabytes
            automaton = self.compiler.compile_regex(values.pattern, max_bytes=self.limits.max_automaton_bytes)
        else:
            automaton = self.compiler.compile(values)
        on_device = DeviceAutomaton(automaton, self.device)
        return CompiledSet(automaton, on_device, automaton.memory_bytes + on_device.memory_bytes + self.ENTRY_OVERHEAD)

    def _compile_schema(self, request: SchemaRequest) -> CompiledSet:
        given = json.loads(request.text)
        if request.kind == SCHEMA_ARG:
            schema: CompiledSchema = self.compiler.compile_json_schema(given)
        else:
            schema = self.compiler.compile_tools(given)  # a tool's arguments compile when it is chosen
        return CompiledSet(None, None, schema.memory_bytes + self.ENTRY_OVERHEAD, schema)

    def get(self, values: Sequence[str] | SchemaRequest | PatternRequest) -> CompiledSet:
        """The compiled set (or schema, or pattern); raises :class:`SetCompileError` (with
        the reason) for one that cannot be compiled, now or at an earlier request."""
        try:
            key = self._key(values)
        except ValueSetError as error:  # not a set of strings: admission checks make this rare
            raise SetCompileError(f"{type(error).__name__}: {error}"[:500]) from error
        self._follow_reloads()
        with self._lock:
            pinned = self._pinned.get(key)
            failure = self._failures.get(key)
            registered = self._registered_keys is not None and key in self._registered_keys
        if pinned is not None:
            return pinned
        if failure is not None:
            raise SetCompileError(failure)
        if registered and isinstance(values, list):  # a registered set updated by name: pinned from now on
            try:
                return self.pin(values)
            except Exception as error:
                raise SetCompileError(f"{type(error).__name__}: {error}"[:500]) from error

        def build() -> CompiledSet:
            if isinstance(values, SchemaRequest):
                return self._compile_schema(values)
            return self._compile(values)

        try:
            return self.cache.get(key, build, lambda entry: entry.nbytes)
        except Exception as error:
            message = f"{type(error).__name__}: {error}"[:500]
            with self._lock:
                self._failures[key] = message
                while len(self._failures) > self._MAX_FAILURES:
                    self._failures.popitem(last=False)
            raise SetCompileError(message) from error

    def _follow_reloads(self) -> None:
        """After the registered sets were reloaded: unpin the sets no longer registered (the
        new ones are pinned when first requested)."""
        generation = registered_generation()
        if generation == self._generation:
            return
        try:
            keys = {self._key(values) for values in registered_sets().values()}
        except ValueError:
            return
        with self._lock:
            self._generation = generation
            self._registered_keys = keys
            for key in [key for key in self._pinned if key not in keys]:
                del self._pinned[key]

    def pin(self, values: Sequence[str]) -> CompiledSet:
        """Compile ``values`` now and keep them for the life of the process (raises on failure)."""
        key = self._key(values)
        with self._lock:
            entry = self._pinned.get(key)
        if entry is None:
            entry = self._compile(values)
            with self._lock:
                entry = self._pinned.setdefault(key, entry)
        return entry

    def ended(self) -> CompiledSet:
        """A set whose initial state allows EOS only: the rows of failed requests use it."""
        if self._ended is None:
            self._ended = self._compile([""])
        return self._ended

    def __len__(self) -> int:
        return len(self.cache)


def compile_registered(sets: CompiledSets) -> None:
    """Compile every set of ``$TRIEMASK_SETS`` now (server start-up), with one summary log
    line; an unreadable folder or a set that does not compile stops the start-up."""
    started = time.perf_counter()
    Limits.from_env()  # a malformed limit setting stops the start-up, not the first request
    registered = registered_sets()
    total = 0
    for name, values in registered.items():
        try:
            total += sets.pin(values).nbytes
        except Exception as error:  # noqa: PERF203 - the error path only
            raise ValueError(f"{SETS_ENV}: set {name!r} does not compile: {error}") from error
    # what every schema of this vocabulary shares, now rather than in the first schema's step
    # (without xgrammar, schema requests end alone with that reason)
    with contextlib.suppress(ImportError):
        prepare_schemas(sets.compiler.vocab)
    if registered:
        logger.info(
            "triemask: %d registered sets (%s; %d values) compiled in %.2f s, %.1f MiB",
            len(registered),
            ", ".join(sorted(registered)),
            sum(map(len, registered.values())),
            time.perf_counter() - started,
            total / (1 << 20),
        )


def hf_vocabulary(tokenizer: Any, vocab_size: int, eos_token_ids: Any = None) -> Vocabulary:
    """The :class:`Vocabulary` of a Hugging Face tokenizer at the model's logits width; EOS
    ids are the tokenizer's and ``eos_token_ids`` (the other tokens the engine stops at)."""
    eos = ({tokenizer.eos_token_id} | set(eos_token_ids or ())) - {None}
    return Vocabulary.from_huggingface(tokenizer, vocab_size=vocab_size, eos_token_ids=sorted(eos))


_ENGINE_SETS: dict[tuple[Any, ...], CompiledSets] = {}
_ENGINE_SETS_LOCK = threading.Lock()


def compiled_sets_for_model(
    tokenizer_name: str, vocab_size: int, device: Any, *, revision: str | None = None, trust_remote_code: bool = False
) -> CompiledSets:
    """The process-wide :class:`CompiledSets` of an engine's model and device.

    The tokenizer is loaded with transformers; EOS ids are the tokenizer's and those of
    the model's generation config (the tokens the engine stops at).
    """
    key = (tokenizer_name, revision, vocab_size, str(device))
    with _ENGINE_SETS_LOCK:
        if key not in _ENGINE_SETS:
            from transformers import AutoTokenizer, GenerationConfig

            tokenizer = AutoTokenizer.from_pretrained(
                tokenizer_name, revision=revision, trust_remote_code=trust_remote_code
            )
            try:
                generation = GenerationConfig.from_pretrained(tokenizer_name, revision=revision or "main").eos_token_id
            except OSError:  # no generation config: the tokenizer's EOS is the one
                generation = None
            extra = generation if isinstance(generation, list | tuple) else [generation]
            _ENGINE_SETS[key] = CompiledSets(Compiler(hf_vocabulary(tokenizer, vocab_size, extra)), device)
        return _ENGINE_SETS[key]


PLACEHOLDER = -1  # vLLM's async scheduling pads output ids with -1 until the real ids arrive


class RowError(Exception):
    """A constrained row cannot go on (its request is ended alone)."""


class Row:
    """One constrained request in a batch: its set, its live output ids and its state."""

    __slots__ = ("compiled", "consumed", "matcher", "output_ids", "state")

    def __init__(self, compiled: CompiledSet, output_ids: Sequence[int]) -> None:
        self.compiled = compiled
        self.output_ids = output_ids  # the engine's live list
        self.matcher = None if compiled.schema is None else SchemaMatcher(compiled.schema, max_rollback=0)
        self.state = 0 if compiled.automaton is None else compiled.automaton.initial_state
        self.consumed = 0

    def catch_up(self) -> None:
        """Advance the state through the output ids not seen yet (usually one)."""
        automaton, ids = self.compiled.automaton, self.output_ids
        if automaton is None:  # a JSON schema: the matcher follows the tokens
            self._catch_up_schema()
            return
        while self.consumed < len(ids):
            token = ids[self.consumed]
            if token == PLACEHOLDER:
                raise RowError(
                    "the request's output token ids hold the placeholder -1: vLLM's async "
                    "scheduling repairs them only for processors passed with --logits-processors "
                    "(or LLM(logits_processors=[...])), not for ones loaded from the entry point alone "
                    "(vLLM issue #52461). Pass the processor explicitly, or use --no-async-scheduling."
                )
            if self.state >= 0 and not automaton.is_final(self.state):
                self.state = automaton.next_state(self.state, int(token))
            self.consumed += 1

    def _catch_up_schema(self) -> None:
        assert self.matcher is not None
        ids = self.output_ids
        while self.consumed < len(ids):
            token = int(ids[self.consumed])
            if token == PLACEHOLDER:
                raise RowError("the request's output token ids hold the placeholder -1 (vLLM issue #52461)")
            if not self.matcher.is_terminated() and not self.matcher.accept_token(token):
                raise RowError(f"token {token} is outside the JSON schema after {self.matcher.text[-80:]!r}")
            self.consumed += 1

    def end(self, sets: CompiledSets) -> None:
        """From now on allow EOS only, so the request stops at its next token."""
        self.compiled = sets.ended()
        self.matcher = None
        self.state = 0
        self.consumed = len(self.output_ids)

    @classmethod
    def ended(cls, sets: CompiledSets, output_ids: Sequence[int]) -> Row:
        """The row of a request that failed: EOS only, from its next token on."""
        row = cls(sets.ended(), output_ids)
        row.end(sets)
        return row


def constrained_row(sets: CompiledSets, extra_args: Any, output_ids: Sequence[int], request: str = "") -> Row | None:
    """The row of a request (None when it asks for no set); never raises.

    A request whose set cannot be compiled gets a row that allows EOS only, and an
    error naming the reason is logged: it ends at once, the rest of the batch goes on.
    """
    try:
        values: Sequence[str] | SchemaRequest | PatternRequest | None = requested_values(extra_args)
        if values is None:
            values = requested_schema(extra_args)
        if values is None:
            values = requested_pattern(extra_args)
        if values is None:
            return None
        return Row(sets.get(values), output_ids)
    except Exception as error:
        logger.error("triemask: request %s ended (only EOS allowed): %s", request or "?", error)
        return Row.ended(sets, output_ids)


def catch_up_rows(sets: CompiledSets, rows: Mapping[Any, Row]) -> None:
    """Advance every row; a row whose output ids are unusable is ended alone."""
    for key, row in rows.items():
        try:
            row.catch_up()
        except Exception as error:  # noqa: PERF203 - any failure ends this row alone
            logger.error("triemask: request %s ended (only EOS allowed): %s", key, error)
            row.end(sets)


def mask_rows(logits: Any, rows: Mapping[int, Row]) -> Any:
    """Mask the logits of every constrained row, in place: one device operation per set,
    whose cost follows the allowed tokens of the rows' states (computed on the host)."""
    import torch

    groups: dict[int, tuple[CompiledSet, list[int], list[int]]] = {}
    schema_rows = {index: row.matcher for index, row in rows.items() if row.matcher is not None}
    if schema_rows:
        mask_schema_rows(logits, schema_rows)
    for index, row in rows.items():
        if row.matcher is not None:
            continue
        group = groups.setdefault(id(row.compiled), (row.compiled, [], []))
        group[1].append(index)
        group[2].append(row.state)
    for compiled, indices, states in groups.values():
        where = torch.tensor(indices, dtype=torch.int64).to(logits.device, non_blocking=True)
        compiled.device_automaton.mask_logits(logits, np.asarray(states, dtype=np.int64), where)
    return logits


def mask_schema_rows(logits: Any, matchers: Mapping[int, SchemaMatcher]) -> Any:
    """Mask the logits rows of JSON-schema requests, in place: the rows' masks are filled
    on the host and applied with one masked fill (a finished or failing row allows EOS only)."""
    import torch

    indices = list(matchers)
    rows = [matchers[index] for index in indices]

    def ended(row: int, error: Exception) -> None:  # a tool's arguments may compile here, and fail
        logger.error("triemask: request in row %s ended (only EOS allowed): %s", indices[row], error)

    allowed = allowed_token_rows(rows, rows[0].schema.eos_token_ids, int(logits.shape[-1]), ended)
    where = torch.tensor(indices, dtype=torch.int64, device=logits.device)
    keep = torch.from_numpy(allowed).to(logits.device, non_blocking=True)
    logits[where] = logits[where].masked_fill(~keep, float("-inf"))
    return logits


class BatchRows:
    """vLLM V1 runner bookkeeping: batch index -> :class:`Row`, kept in step with the
    engine's ``BatchUpdate`` (removed, then added, then moved).

    An update is all or nothing: the rows of the added requests are built first (a
    request whose set fails is given an EOS-only row, never an exception), then the
    removals, additions and moves are applied, none of which can fail.
    """

    def __init__(self, sets: CompiledSets) -> None:
        self.sets = sets
        self.rows: dict[int, Row] = {}

    def update(self, batch_update: Any) -> None:
        if batch_update is not None:
            added = [
                (index, constrained_row(self.sets, getattr(params, "extra_args", None), output_ids, f"row {index}"))
                for index, params, _prompt_ids, output_ids in batch_update.added
            ]
            for index in batch_update.removed:
                self.rows.pop(index, None)
            for index, row in added:
                if row is None:
                    self.rows.pop(index, None)  # the slot's previous occupant, if any
                else:
                    self.rows[index] = row
            for first, second, direction in batch_update.moved:
                moving, other = self.rows.pop(first, None), self.rows.pop(second, None)
                if moving is not None:
                    self.rows[second] = moving
                if other is not None and getattr(direction, "name", direction) == "SWAP":
                    self.rows[first] = other
        catch_up_rows(self.sets, self.rows)

    def apply(self, logits: Any) -> Any:
        return mask_rows(logits, self.rows) if self.rows else logits


_SCHEMA_SLOT = -2  # set_of marker: the slot's request follows a JSON schema, on the host


class SlotStates:
    """vLLM Model Runner V2 bookkeeping: the state of every request slot, on the device.

    ``add`` (at admission) records the slot's set and schedules a reset; ``flush``
    writes the resets; ``apply`` advances each constrained row by the token it was fed
    (``ctx.input_ids``) and masks all of a set's rows in one device operation. The
    number of output tokens a row has is ``seq_len - prompt_len`` from host arrays, so
    nothing waits for the device; a slot that has more than one token to catch up (a
    request resumed after preemption) replays them from ``all_token_ids``.
    """

    def __init__(self, sets: CompiledSets, req_states: Any) -> None:
        import torch

        self.sets = sets
        self.req_states = req_states
        slots = int(req_states.max_num_reqs)
        self.compiled: list[CompiledSet] = []  # the sets in use, indexed by set_of
        self.set_of = np.full(slots, -1, dtype=np.int64)  # per slot: its set's index, -1 for none
        self.consumed = np.zeros(slots, dtype=np.int64)
        self.states = torch.zeros(slots, dtype=torch.int64, device=req_states.device)
        self._resets: list[int] = []
        self.schema_rows: dict[int, Row] = {}  # slots of JSON-schema requests

    def add(self, slot: int, params: Any) -> bool:
        row = constrained_row(self.sets, getattr(params, "extra_args", None), (), f"in slot {slot}")
        self.consumed[slot] = 0
        self.schema_rows.pop(slot, None)
        if row is None:
            self.set_of[slot] = -1
            return False
        if row.matcher is not None:  # a JSON schema: followed on the host
            self.schema_rows[slot] = row
            self.set_of[slot] = _SCHEMA_SLOT
            return True
        self._use(slot, row.compiled)
        return True

    def _use(self, slot: int, compiled: CompiledSet) -> None:
        """Give ``slot`` the set ``compiled`` (the EOS-only set for a request whose set failed)."""
        known = next((i for i, c in enumerate(self.compiled) if c is compiled), None)
        if known is None:
            in_use = set(self.set_of[self.set_of >= 0].tolist())
            known = next((i for i in range(len(self.compiled)) if i not in in_use), len(self.compiled))
            if known == len(self.compiled):
                self.compiled.append(compiled)
            else:
                self.compiled[known] = compiled  # reuse the entry of a set no slot holds any more
        self.set_of[slot] = known
        self._resets.append(slot)

    def flush(self) -> None:
        if self._resets:
            self.states[self._resets] = 0  # every automaton's initial state is node 0
            self._resets.clear()

    def apply(self, logits: Any, ctx: Any) -> Any:
        import torch

        self.flush()
        slots = np.asarray(ctx.idx_mapping_np, dtype=np.int64)
        if len(slots) != logits.shape[0]:
            raise RuntimeError(
                f"triemask: {logits.shape[0]} logits rows for {len(slots)} requests: speculative decoding "
                "is not supported by the triemask processor"
            )
        produced = np.maximum(
            np.asarray(ctx.seq_lens_upper_bound_np, dtype=np.int64)[: len(slots)]
            - self.req_states.prompt_len.np[slots],
            0,
        )
        if (self.set_of[slots] == _SCHEMA_SLOT).any():
            self._schema_rows(logits, ctx, slots, produced)
            self.flush()  # rows ended there were given the EOS-only set
        row_sets = self.set_of[slots]
        for index in np.unique(row_sets[row_sets >= 0]).tolist():
            on_device = self.compiled[index].device_automaton
            rows = np.flatnonzero(row_sets == index)
            row_slots = slots[rows]
            new = produced[rows] - self.consumed[row_slots]
            stepping = new == 1  # the usual case: one new token, the one fed to the model this step
            if stepping.any():
                where = torch.from_numpy(rows[stepping]).to(logits.device, non_blocking=True)
                targets = torch.from_numpy(row_slots[stepping]).to(self.states.device)
                self.states[targets] = on_device.next_states(self.states[targets], ctx.input_ids[where])
            for slot, count in zip(row_slots[new > 1].tolist(), produced[rows][new > 1].tolist(), strict=True):
                self._replay(on_device, slot, count)  # rare: a request resumed after preemption
            self.consumed[row_slots] = produced[rows]
            where = torch.from_numpy(rows).to(logits.device, non_blocking=True)
            on_device.mask_logits(logits, self.states[torch.from_numpy(row_slots).to(self.states.device)], where)
        return logits

    def _schema_rows(self, logits: Any, ctx: Any, slots: Any, produced: Any) -> None:
        """Advance the JSON-schema rows on the host (their new tokens come over in one
        copy) and mask them; a row whose token the schema rejects ends alone."""
        rows = np.flatnonzero(self.set_of[slots] == _SCHEMA_SLOT)
        fed = ctx.input_ids[rows.tolist()].tolist() if rows.size else []
        matchers: dict[int, SchemaMatcher] = {}
        for row, token in zip(rows.tolist(), fed, strict=True):
            slot = int(slots[row])
            entry = self.schema_rows[slot]
            new = int(produced[row] - self.consumed[slot])
            if new == 1:
                tokens = [int(token)]
            else:  # a request resumed after preemption: all of its output so far
                start = int(self.req_states.prompt_len.np[slot])
                tokens = self.req_states.all_token_ids.gpu[slot, start : start + int(produced[row])].tolist()
                tokens = tokens[int(self.consumed[slot]) :] if new > 1 else []
            try:
                entry.output_ids = [*entry.output_ids, *tokens]
                entry.catch_up()
            except Exception as error:
                logger.error("triemask: request in slot %s ended (only EOS allowed): %s", slot, error)
                del self.schema_rows[slot]
                self._use(slot, self.sets.ended())
                continue
            self.consumed[slot] = produced[row]
            assert entry.matcher is not None
            matchers[row] = entry.matcher
        if matchers:
            mask_schema_rows(logits, matchers)

    def _replay(self, on_device: Any, slot: int, produced: int) -> None:
        """Walk a slot from the initial state through all of its output tokens."""
        start = int(self.req_states.prompt_len.np[slot])
        tokens = self.req_states.all_token_ids.gpu[slot, start : start + produced]
        state = self.states[slot : slot + 1].clone().fill_(0)
        for token in tokens.split(1):
            state = on_device.next_states(state, token)
        self.states[slot] = state[0]
