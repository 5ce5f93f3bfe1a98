"""Compile budgets: what an automaton may cost before it is built."""

from __future__ import annotations

from ..automata import DEFAULT_CACHE_BYTES
from ..base import MemoryLimitError, ValueSetError, integer


def checked_budget(max_bytes: int | None) -> int | None:
    """``max_bytes`` checked: None, or a positive integer (``ValueSetError`` otherwise)."""
    if max_bytes is None:
        return None
    max_bytes = integer(max_bytes, "max_bytes", ValueSetError, "a positive integer")
    if max_bytes <= 0:
        raise ValueSetError(f"max_bytes must be a positive integer, got {max_bytes}")
    return max_bytes


def checked_cache_bytes(cache_bytes: int | None, layout: str) -> int:
    """The lazy layout's cache bound: ``cache_bytes`` checked (a non-negative integer, and
    given with ``layout="lazy"`` only: ``ValueSetError`` otherwise), by default
    :data:`~triemask.DEFAULT_CACHE_BYTES`."""
    if cache_bytes is None:
        return DEFAULT_CACHE_BYTES
    if layout != "lazy":
        raise ValueSetError(f"cache_bytes applies to layout='lazy' only, not layout={layout!r:.40}")
    cache_bytes = integer(cache_bytes, "cache_bytes", ValueSetError, "a non-negative integer")
    if cache_bytes < 0:
        raise ValueSetError(f"cache_bytes must be a non-negative integer, got {cache_bytes}")
    return cache_bytes


class EdgeBudget:
    """The edges an acyclic automaton's compile may make within ``max_bytes`` (8 bytes each
    in the automaton, 8 more while they are sorted), spent as the matching finds them and
    checked against what the next step will hold, so a hostile pattern is refused after
    work proportional to the budget, before the large allocations."""

    BYTES_PER_EDGE = 16
    WORK_PER_EDGE = 1  # frontier entries the matching may visit per edge of the budget

    def __init__(self, max_bytes: int | None, num_nodes: int, pattern: str | None) -> None:
        self.max_bytes = max_bytes
        self.fixed = 16 * (num_nodes + 1)  # the offsets and levels
        self.num_nodes = num_nodes
        self.max_edges = -1 if max_bytes is None else (max_bytes - self.fixed) // self.BYTES_PER_EDGE
        self.max_work = -1 if max_bytes is None else self.WORK_PER_EDGE * self.max_edges
        self.spent = self.work = 0
        self.what = f"the automaton of {pattern!r:.60}" if pattern is not None else "the automaton"

    def check_nodes(self) -> None:
        """Refuse before any matching when the nodes alone pass the budget (then ``max_edges``
        is negative, which the C matching would read as no limit)."""
        if self.max_bytes is not None and self.fixed > self.max_bytes:
            raise MemoryLimitError(
                f"{self.what} needs at least {self.fixed:,} bytes for its {self.num_nodes:,} nodes, more "
                f"than max_bytes={self.max_bytes:,}",
                limit=self.max_bytes,
                needed=self.fixed,
            )

    def spend(self, edges: int, frontier: int) -> None:
        """``edges`` found; the next step visits ``frontier`` entries (the work, bounded too:
        most of a wide pattern's paths end in no token, and cost all the same)."""
        self.spent += edges
        self.work += frontier
        if self.max_bytes is None:
            return
        if max(self.spent, frontier) > self.max_edges:
            self._refuse(max(self.spent, frontier))
        if self.work > self.max_work:
            self._refuse_work(self.work)

    def refuse(self, passed: str) -> None:
        """Raise for the C matching's answer when it stopped: ``"edges"`` or ``"work"`` passed the budget."""
        if passed == "work":
            self._refuse_work(self.max_work + 1)
        self._refuse(self.max_edges + 1)

    def check_total(self, edges: int) -> None:
        if self.max_bytes is not None and edges > self.max_edges:
            self._refuse(edges)

    def _refuse_work(self, work: int) -> None:
        assert self.max_bytes is not None
        raise MemoryLimitError(
            f"matching {self.what} against this vocabulary visits more than {work:,} paths, more "
            f"than max_bytes={self.max_bytes:,} allows ({self.WORK_PER_EDGE} per edge it could hold)",
            limit=self.max_bytes,
            needed=work // self.WORK_PER_EDGE * self.BYTES_PER_EDGE,
        )

    def _refuse(self, edges: int) -> None:
        assert self.max_bytes is not None
        raise MemoryLimitError(
            f"{self.what} needs at least {edges * self.BYTES_PER_EDGE:,} bytes for its edges with this "
            f"vocabulary, more than max_bytes={self.max_bytes:,}",
            limit=self.max_bytes,
            needed=edges * self.BYTES_PER_EDGE,
        )


def over_budget(limit: int, needed: int, what: str) -> MemoryLimitError:
    return MemoryLimitError(
        f"the set needs at least {needed:,} bytes for {what}, more than max_bytes={limit:,}: "
        "raise the limit, split the set, or use layout='dag' for sets with common endings",
        limit=limit,
        needed=needed,
    )


# --------------------------------------------------------------------------- values
