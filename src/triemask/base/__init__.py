"""The base layer: errors, bitmasks, the C kernels' loader, the file format and its kinds,
byte tries and byte DAGs, value encoding and fingerprints, the byte-bounded LRU. Imports nothing
of triemask."""

from . import kernels, storage
from .bitmask import INT32, allocate_token_bitmask, as_bitmask_array, bitmask_width, unpack_bitmask
from .dag import ByteDag, canonical_numbering, dag_arrays, dag_from_buffers, dag_of_trie, mix64
from .errors import (
    ArgumentTypeError,
    AutomatonFileError,
    BitmaskError,
    IncompatibleValueError,
    MemoryLimitError,
    PatternError,
    SchemaError,
    StateError,
    TriemaskError,
    TriemaskWarning,
    UnboundedPatternError,
    UnenforcedSchemaWarning,
    ValueIndexError,
    ValueSetError,
    VocabularyError,
    integer,
)
from .kinds import file_kinds, kind_class, kinds_of, register_kind
from .lru import BoundedLRU
from .storage import cache_directory, read, read_regular_file
from .trie import ByteTrie, build_trie
from .values import encode_values, set_fingerprint, sorted_unique, values_fingerprint

__all__ = [
    "INT32",
    "ArgumentTypeError",
    "AutomatonFileError",
    "BitmaskError",
    "BoundedLRU",
    "ByteDag",
    "ByteTrie",
    "IncompatibleValueError",
    "MemoryLimitError",
    "PatternError",
    "SchemaError",
    "StateError",
    "TriemaskError",
    "TriemaskWarning",
    "UnboundedPatternError",
    "UnenforcedSchemaWarning",
    "ValueIndexError",
    "ValueSetError",
    "VocabularyError",
    "allocate_token_bitmask",
    "as_bitmask_array",
    "bitmask_width",
    "build_trie",
    "cache_directory",
    "canonical_numbering",
    "dag_arrays",
    "dag_from_buffers",
    "dag_of_trie",
    "encode_values",
    "file_kinds",
    "integer",
    "kernels",
    "kind_class",
    "kinds_of",
    "mix64",
    "read",
    "read_regular_file",
    "register_kind",
    "set_fingerprint",
    "sorted_unique",
    "storage",
    "unpack_bitmask",
    "values_fingerprint",
]
