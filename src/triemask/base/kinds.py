"""The kinds of file triemask writes, in one registry: each kind names the class that restores it.

Every layer registers its own kinds when it is imported (automata: ``trie``, ``dag``,
``lazy``; the token index: ``token_index``; schemas: ``schema``, ``tools``), so that a reader
asks for the kinds of a class (:func:`kinds_of`) and restores what a file holds without
importing the layer that wrote it.
"""

from __future__ import annotations

from typing import Any

from .errors import AutomatonFileError

_KINDS: dict[str, type[Any]] = {}


def register_kind(kind: str, cls: type[Any]) -> None:
    """Let files of ``kind`` load as ``cls`` (a kind is registered once, by the class that writes it)."""
    if _KINDS.setdefault(kind, cls) is not cls:
        raise ValueError(f"file kind {kind!r} is registered to {_KINDS[kind].__qualname__} already")


def kind_class(kind: str, source: str = "the file") -> type[Any]:
    """The class that restores files of ``kind``."""
    found = _KINDS.get(kind)
    if found is None:
        raise AutomatonFileError(f"{source} holds a {kind!r}, which no loaded part of triemask reads", field="kind")
    return found


def kinds_of(base: type[Any]) -> tuple[str, ...]:
    """The kinds whose class is ``base`` or a subclass of it."""
    return tuple(kind for kind, cls in _KINDS.items() if issubclass(cls, base))


def file_kinds() -> tuple[str, ...]:
    """Every registered kind."""
    return tuple(_KINDS)
