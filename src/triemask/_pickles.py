"""Pickles written before the layered layout (triemask 0.1.0, flat modules) name the modules
their objects were made by: ``triemask._automaton._from_bytes``, ``triemask._mixed._schema_from_bytes``,
``triemask._vocabulary.Vocabulary`` and ``triemask._matcher.Matcher``. Those names are kept
loadable here, as small stand-in modules, so that such pickles still load. New pickles name
the current modules; nothing else reads the stand-ins.
"""

from __future__ import annotations

import sys
import types

from .automata import automaton_from_bytes
from .matcher import Matcher
from .schemas import schema_from_bytes
from .vocab import Vocabulary

__all__ = ["keep_old_pickles_loadable"]

_FORMER_NAMES: dict[str, dict[str, object]] = {
    "triemask._automaton": {"_from_bytes": automaton_from_bytes},
    "triemask._mixed": {"_schema_from_bytes": schema_from_bytes},
    "triemask._vocabulary": {"Vocabulary": Vocabulary},
    "triemask._matcher": {"Matcher": Matcher},
}


def keep_old_pickles_loadable() -> None:
    """Register the former module names that old pickles refer to (idempotent)."""
    for name, attributes in _FORMER_NAMES.items():
        if name not in sys.modules:
            module = types.ModuleType(name, f"Stand-in for pickles made by triemask 0.1.0 (see {__name__}).")
            module.__dict__.update(attributes)
            sys.modules[name] = module
