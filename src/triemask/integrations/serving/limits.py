"""Request limits and the request arguments' names."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

logger = logging.getLogger("triemask")

VALUES_ARG = "triemask_values"
SET_ARG = "triemask_set"
SCHEMA_ARG = "triemask_json_schema"  # a JSON schema (object or JSON text): enum fields in tries
TOOLS_ARG = "triemask_tools"  # OpenAI-style function specs: {"name": ..., "arguments": ...}
REGEX_ARG = "triemask_regex"  # a regex with a finite language (no * or +): its acyclic automaton
FORMAT_ARG = "triemask_format"  # a built-in format: date, time, date-time, uuid, ipv4, ipv6
REQUEST_ARGS = (VALUES_ARG, SET_ARG, SCHEMA_ARG, TOOLS_ARG, REGEX_ARG, FORMAT_ARG)
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
    tool's parameters, estimated from what it holds: :func:`triemask.schemas.reading.structure_cost`)."""

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
