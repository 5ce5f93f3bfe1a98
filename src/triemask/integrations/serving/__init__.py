"""What the serving-engine adapters (vLLM, SGLang) share, free of any engine import.

Modules, each importing only the ones before it: ``limits`` (request arguments and the
operator's limits), ``registry`` (registered set files), ``requests`` (reading and pricing a
request), ``compiled_sets`` (the per-engine cache of compiled requests), ``rows`` (a batch's rows
caught up and masked).

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

from .compiled_sets import (
    CompiledSet,
    CompiledSets,
    SetCompileError,
    compile_registered,
    compiled_sets_for_model,
    hf_vocabulary,
)
from .limits import (
    CACHE_BYTES_ENV,
    DEFAULT_CACHE_BYTES,
    FORMAT_ARG,
    MAX_AUTOMATON_BYTES_ENV,
    MAX_PATTERN_BYTES_ENV,
    MAX_SCHEMA_COST_ENV,
    MAX_SET_BYTES_ENV,
    MAX_VALUE_BYTES_ENV,
    MAX_VALUES_ENV,
    REGEX_ARG,
    SCHEMA_ARG,
    SET_ARG,
    SETS_ENV,
    TOOLS_ARG,
    VALUES_ARG,
    Limits,
    RequestError,
)
from .registry import MAX_SET_FILE_BYTES, RELOAD_SECONDS, load_sets, registered_generation, registered_sets
from .requests import (
    PatternRequest,
    SchemaRequest,
    literal_alternatives,
    requested_pattern,
    requested_schema,
    requested_values,
    validate_request,
)
from .rows import (
    PLACEHOLDER,
    BatchRows,
    Row,
    RowError,
    SlotStates,
    catch_up_rows,
    constrained_row,
    mask_rows,
    mask_schema_rows,
)

__all__ = [
    "CACHE_BYTES_ENV",
    "DEFAULT_CACHE_BYTES",
    "FORMAT_ARG",
    "MAX_AUTOMATON_BYTES_ENV",
    "MAX_PATTERN_BYTES_ENV",
    "MAX_SCHEMA_COST_ENV",
    "MAX_SET_BYTES_ENV",
    "MAX_SET_FILE_BYTES",
    "MAX_VALUES_ENV",
    "MAX_VALUE_BYTES_ENV",
    "PLACEHOLDER",
    "REGEX_ARG",
    "RELOAD_SECONDS",
    "SCHEMA_ARG",
    "SETS_ENV",
    "SET_ARG",
    "TOOLS_ARG",
    "VALUES_ARG",
    "BatchRows",
    "CompiledSet",
    "CompiledSets",
    "Limits",
    "PatternRequest",
    "RequestError",
    "Row",
    "RowError",
    "SchemaRequest",
    "SetCompileError",
    "SlotStates",
    "catch_up_rows",
    "compile_registered",
    "compiled_sets_for_model",
    "constrained_row",
    "hf_vocabulary",
    "literal_alternatives",
    "load_sets",
    "mask_rows",
    "mask_schema_rows",
    "registered_generation",
    "registered_sets",
    "requested_pattern",
    "requested_schema",
    "requested_values",
    "validate_request",
]
