"""Mixed JSON schemas and tool lists: reading schemas, vocabulary support, enum fields, the
compiled schema, its decoding engine and matcher. Imports every layer below."""

from .compiled import CompiledSchema, schema_from_bytes
from .fields import SchemaOptions, stored_field_automaton
from .matcher import SchemaMatcher, allowed_token_bitmask, allowed_token_rows, fill_next_token_bitmasks
from .reading import TOO_DEEP, StructureCost, dispatch, dispatched_cost, load_schema, structure_cost
from .requests import RequestConstraint, constraint_of_request
from .structure import DEFAULT_MIN_ENUM_VALUES, DEFAULT_MIN_UNION_BRANCHES
from .support import clear_structure_cache, prepare_schemas
from .tools import DEFAULT_TOOL_CACHE_BYTES, CompiledTools, read_tools

__all__ = [
    "DEFAULT_MIN_ENUM_VALUES",
    "DEFAULT_MIN_UNION_BRANCHES",
    "DEFAULT_TOOL_CACHE_BYTES",
    "TOO_DEEP",
    "CompiledSchema",
    "CompiledTools",
    "RequestConstraint",
    "SchemaMatcher",
    "SchemaOptions",
    "StructureCost",
    "allowed_token_bitmask",
    "allowed_token_rows",
    "clear_structure_cache",
    "constraint_of_request",
    "dispatch",
    "dispatched_cost",
    "fill_next_token_bitmasks",
    "load_schema",
    "prepare_schemas",
    "read_tools",
    "schema_from_bytes",
    "stored_field_automaton",
    "structure_cost",
]
