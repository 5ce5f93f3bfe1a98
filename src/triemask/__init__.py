"""triemask: make an LLM pick exactly one string from a large finite set.

Build a :class:`Vocabulary` for the model, a :class:`Compiler` for the vocabulary
(once), and compile each set of allowed strings into a :class:`TrieAutomaton`.
The automaton gives, for any state, the allowed tokens as a precomputed lookup;
a :class:`Matcher` follows one sequence through it. JSON schemas and tool lists
with large enum fields compile to a :class:`CompiledSchema` (enums in tries, the
structure in xgrammar, the optional ``schema`` extra), followed the same way.
Finite regexes and formats (dates, UUIDs) compile to a :class:`DagAutomaton`, the
same lookup over the language's minimal acyclic automaton.

>>> from triemask import Compiler, Matcher, Vocabulary
>>> vocab = Vocabulary([b"get", b"_", b"user", b"g", b"et", None], eos_token_ids=5)
>>> automaton = Compiler(vocab).compile(["get_user", "get"])
>>> matcher = Matcher(automaton)
>>> matcher.accept_tokens([0, 1, 2, 5]), matcher.value
(4, 'get_user')
"""

from typing import TYPE_CHECKING

from ._pickles import keep_old_pickles_loadable
from ._version import __version__
from .automata import (
    DEAD,
    DEFAULT_CACHE_BYTES,
    DagAutomaton,
    LazyDagAutomaton,
    LazyTrieAutomaton,
    TrieAutomaton,
    UpdatedTrieAutomaton,
)
from .base import (
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
    allocate_token_bitmask,
    bitmask_width,
)
from .cache import DEFAULT_COMPILE_CACHE_BYTES, CompileCache, default_compile_cache, values_fingerprint
from .compiler import Compiler
from .matcher import Matcher
from .schemas import (
    DEFAULT_MIN_ENUM_VALUES,
    DEFAULT_MIN_UNION_BRANCHES,
    CompiledSchema,
    CompiledTools,
    SchemaMatcher,
    fill_next_token_bitmasks,
)
from .sets import FORMATS
from .vocab import Vocabulary

if TYPE_CHECKING:  # imported on first use below: they need torch and transformers
    from .app.model import load_default_model as load_default_model
    from .integrations.transformers import choose as choose
    from .integrations.transformers import generate_json as generate_json

keep_old_pickles_loadable()


def __getattr__(name: str) -> object:
    # choose, generate_json and load_default_model need torch and transformers: imported on first use.
    if name in ("choose", "generate_json"):
        from .integrations import transformers

        return getattr(transformers, name)
    if name == "load_default_model":
        from .app.model import load_default_model

        return load_default_model
    raise AttributeError(f"module 'triemask' has no attribute {name!r}")


__all__ = [
    "DEAD",
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_COMPILE_CACHE_BYTES",
    "DEFAULT_MIN_ENUM_VALUES",
    "DEFAULT_MIN_UNION_BRANCHES",
    "FORMATS",
    "ArgumentTypeError",
    "AutomatonFileError",
    "BitmaskError",
    "CompileCache",
    "CompiledSchema",
    "CompiledTools",
    "Compiler",
    "DagAutomaton",
    "IncompatibleValueError",
    "LazyDagAutomaton",
    "LazyTrieAutomaton",
    "Matcher",
    "MemoryLimitError",
    "PatternError",
    "SchemaError",
    "SchemaMatcher",
    "StateError",
    "TrieAutomaton",
    "TriemaskError",
    "TriemaskWarning",
    "UnboundedPatternError",
    "UnenforcedSchemaWarning",
    "UpdatedTrieAutomaton",
    "ValueIndexError",
    "ValueSetError",
    "Vocabulary",
    "VocabularyError",
    "__version__",
    "allocate_token_bitmask",
    "bitmask_width",
    "default_compile_cache",
    "fill_next_token_bitmasks",
    "values_fingerprint",
]
