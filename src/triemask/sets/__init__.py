"""Compiling sets, patterns and formats to automata: the set compiler, token matching, regexes
and formats, incremental updates, the lazy layout's arrays. Imports ``base``, ``vocab``, ``automata``."""

from .compiler import SetCompiler
from .regex import FORMATS, dag_of_pattern, literal_alternatives, unanchored

__all__ = ["FORMATS", "SetCompiler", "dag_of_pattern", "literal_alternatives", "unanchored"]
