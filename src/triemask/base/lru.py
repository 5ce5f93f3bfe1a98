"""The one bounded map of triemask: least recently used entries go first, past a bound on
their number or on the sum of their sizes (bytes). Every cache of the library is one of these
(compiled sets, tool argument schemas, lazy nodes' edges, token pieces, refused patterns,
compilers per vocabulary, serving rows and failures).

Not thread-safe by itself: each owner holds its own lock around it, because most also guard
other state with that lock (a pending build, a byte total shared with another tier).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

__all__ = ["BoundedLRU"]

_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V")


class BoundedLRU(Generic[_K, _V]):
    """A map holding at most ``limit``: entries (each of size 1, the default), or bytes (each
    entry's ``size`` given to :meth:`put`). Reading an entry makes it the most recent; adding one
    evicts the least recent until the total fits. ``hits``, ``misses`` and ``evictions`` count
    what happened (:meth:`get` counts hits and misses)."""

    __slots__ = ("_entries", "_used", "evictions", "hits", "limit", "misses")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._entries: OrderedDict[_K, tuple[_V, int]] = OrderedDict()
        self._used = 0
        self.hits = self.misses = self.evictions = 0

    def get(self, key: _K) -> _V | None:
        """The entry under ``key`` (now the most recent), or None."""
        found = self._entries.get(key)
        if found is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return found[0]

    def put(self, key: _K, value: _V, size: int = 1) -> bool:
        """Keep ``value`` under ``key`` (replacing what was there), evicting the least recent
        entries past the bound; False, and nothing kept, when ``size`` alone exceeds it."""
        if size > self.limit:
            return False
        previous = self._entries.pop(key, None)
        if previous is not None:
            self._used -= previous[1]
        self._entries[key] = (value, size)
        self._used += size
        while self._used > self.limit:
            _, (_, evicted) = self._entries.popitem(last=False)
            self._used -= evicted
            self.evictions += 1
        return True

    def setdefault(self, key: _K, value: _V, size: int = 1) -> _V:
        """The entry under ``key`` if there is one (now the most recent), else ``value``, kept."""
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
            return found[0]
        self.put(key, value, size)
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[_K]:
        return iter(self._entries)

    @property
    def used(self) -> int:
        """The sum of the entries' sizes (their number, for entries of size 1)."""
        return self._used

    def clear(self) -> None:
        """Drop every entry (the counts stay)."""
        self._entries.clear()
        self._used = 0
