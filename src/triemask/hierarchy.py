"""Very large sets in two constrained stages: hierarchical rewriting and shortlists.

Two ways to lower the number of choices a model faces per step when a set holds
hundreds of thousands of values (paper, appendices I and J):

* :class:`Hierarchy` splits the set into about sqrt(K) groups, by shared prefix, by a
  taxonomy the caller gives (ICD-10-CM chapters), or by k-means over embeddings the
  caller computed, and rewrites every value ``v`` as ``label + separator + v``. Compiled
  as one set, the model first writes a group's label (constrained to the G labels),
  then a member of that group (constrained to its K_j members): the per-step choice is
  ``max(G, max K_j)``, about sqrt(K) (Proposition 2), through the same ``Matcher``,
  processors and batch APIs as any set. :meth:`Hierarchy.member` maps the output back.
* :class:`Shortlist` ranks the values by a score the caller computed (say, embedding
  similarity to the prompt) and decodes in stages: the top k and a reserved
  ``none of these``, then the top 2k, ..., then the whole set. Each stage is a set; a
  stage whose output is the reserved string moves on to the next, and the last stage is
  the full set, so the answer is always a member.

Both only rewrite sets, so their guarantee is the automaton's: whatever the model does,
the output is a member of the full set. NumPy only; embeddings and scores come from the
caller (benchmarks and the eval compute them with sentence-transformers).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .automata import TrieAutomaton
from .base import ArgumentTypeError, ValueSetError, integer
from .compiler import Compiler

__all__ = ["Hierarchy", "Shortlist", "recall_at_k"]

SEPARATOR = " / "


def _distinct(values: Iterable[str]) -> list[str]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueSetError(f"values must be an iterable of str, got {type(values).__name__}")
    items = list(dict.fromkeys(values))
    for i, value in enumerate(items):
        if not isinstance(value, str):
            raise ValueSetError(f"values must be str; value #{i} is {type(value).__name__}: {value!r:.60}")
    if not items:
        raise ValueSetError("cannot split an empty set of values")
    return items


def _shared_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


class Hierarchy:
    """A set rewritten as ``label + separator + member``, grouped into about sqrt(K) groups.

    Build one with :meth:`by_prefix`, :meth:`by_taxonomy` or :meth:`by_embeddings`;
    :meth:`compile` gives the automaton of the rewritten set and :meth:`member` the
    member an output names.

    Examples
    --------
    >>> h = Hierarchy.by_taxonomy(["I21.4", "I10", "J45.909"], lambda code: "chapter " + code[0])
    >>> h.rewritten
    ['chapter I / I21.4', 'chapter I / I10', 'chapter J / J45.909']
    >>> h.member("chapter I / I10"), h.cardinality
    ('I10', 2)
    """

    def __init__(self, groups: dict[str, list[str]], *, separator: str = SEPARATOR) -> None:
        if not isinstance(separator, str) or not separator:
            raise ValueSetError(f"separator must be a non-empty str, got {separator!r:.40}")
        if not groups:
            raise ValueSetError("a hierarchy needs at least one group")
        self.separator = separator
        self.groups: dict[str, list[str]] = {}
        self._member_of: dict[str, str] = {}
        seen: dict[str, str] = {}
        for label, members in groups.items():
            if not isinstance(label, str):
                raise ValueSetError(f"group labels must be str, got {type(label).__name__}: {label!r:.60}")
            members = _distinct(members)
            for member in members:
                if member in seen:
                    raise ValueSetError(
                        f"value {member!r:.60} is in two groups: {seen[member]!r:.60} and {label!r:.60}"
                    )
                seen[member] = label
                self._member_of[label + separator + member] = member
            self.groups[label] = members

    # ------------------------------------------------------------------ building

    @classmethod
    def by_taxonomy(cls, values: Iterable[str], label_of: Callable[[str], str], **options: Any) -> Hierarchy:
        """Group by a label the caller computes per value (a chapter, a category, a domain)."""
        if not callable(label_of):
            raise ArgumentTypeError(f"label_of must be callable, got {type(label_of).__name__}")
        groups: dict[str, list[str]] = {}
        for value in _distinct(values):
            groups.setdefault(label_of(value), []).append(value)
        return cls(groups, **options)

    @classmethod
    def by_prefix(cls, values: Iterable[str], *, group_size: int | None = None, **options: Any) -> Hierarchy:
        """Group by shared prefix: a group is a prefix with at most ``group_size`` members
        (default ceil(sqrt(K))); a prefix with more is split by its next character, and
        the children too small to be groups (under a quarter of the size) stay with it.
        The label is the prefix."""
        items = sorted(_distinct(values))
        size = math.ceil(math.sqrt(len(items))) if group_size is None else group_size
        size = integer(size, "group_size", ValueSetError, "a positive integer")
        if size < 1:
            raise ValueSetError(f"group_size must be a positive integer, got {size}")
        groups: dict[str, list[str]] = {}
        pending = [("", items)]  # an explicit stack: sets of long shared prefixes nest deeply
        while pending:
            prefix, members = pending.pop()
            if len(members) <= size:
                groups[prefix] = members
                continue
            depth = len(prefix)
            own = [m for m in members if len(m) == depth]
            children: dict[str, list[str]] = {}
            for member in members:
                if len(member) > depth:
                    children.setdefault(prefix + member[depth], []).append(member)
            if not own:  # no group where the members only go one way on: extend the prefix
                common = _shared_prefix(members[0], members[-1])  # members are sorted
                if len(common) > depth:
                    pending.append((common, members))
                    continue
            for child, rest in children.items():
                if len(rest) >= max(1, size // 4):
                    pending.append((child, rest))
                else:
                    own.extend(rest)
            if own:
                groups[prefix] = own
        return cls(groups, **options)

    @classmethod
    def by_embeddings(
        cls,
        values: Iterable[str],
        embeddings: npt.ArrayLike,
        *,
        groups: int | None = None,
        seed: int = 0,
        iterations: int = 25,
        describe: Callable[[str], str] | None = None,
        **options: Any,
    ) -> Hierarchy:
        """Group by k-means (cosine, k-means++ start) over one embedding row per value,
        ``groups`` clusters (default ceil(sqrt(K))). A group's label is its member
        nearest the centroid, so the model reads a real value as the group's name, or
        ``describe(that member)`` (say, an ICD-10-CM code's description; labels that
        come out equal get `` (2)``, `` (3)``...)."""
        items = _distinct(values)
        vectors = np.asarray(embeddings, dtype=np.float64)
        if vectors.ndim != 2 or len(vectors) != len(items):
            raise ValueSetError(
                f"embeddings must have one row per distinct value: shape ({len(items)}, d), got {vectors.shape}"
            )
        k = math.ceil(math.sqrt(len(items))) if groups is None else integer(groups, "groups", ValueSetError, "an int")
        if not 1 <= k <= len(items):
            raise ValueSetError(f"groups must lie in [1, {len(items)}], got {k}")
        unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        assignment, centroids = _kmeans(unit, k, seed, iterations)
        clusters: dict[str, list[str]] = {}
        for cluster in range(k):
            members = np.flatnonzero(assignment == cluster)
            if not len(members):
                continue
            nearest = members[int(np.argmax(unit[members] @ centroids[cluster]))]
            label = items[nearest] if describe is None else str(describe(items[nearest]))
            if label in clusters:
                label = next(f"{label} ({n})" for n in range(2, len(items) + 2) if f"{label} ({n})" not in clusters)
            clusters[label] = [items[i] for i in members]
        return cls(clusters, **options)

    # ------------------------------------------------------------------ using

    @property
    def rewritten(self) -> list[str]:
        """The set to compile: ``label + separator + member`` for every member."""
        return list(self._member_of)

    @property
    def cardinality(self) -> int:
        """The most choices any stage offers: ``max(G, largest group)`` (Proposition 2)."""
        return max(len(self.groups), max(map(len, self.groups.values())))

    def compile(self, compiler: Compiler, **options: Any) -> TrieAutomaton:
        """The automaton of :attr:`rewritten` (``options`` as in :meth:`Compiler.compile`)."""
        return compiler.compile(self.rewritten, **options)

    def member(self, output: str) -> str:
        """The member an output of the rewritten set names (``KeyError`` for anything else)."""
        try:
            return self._member_of[output]
        except KeyError:
            raise KeyError(f"{output!r:.80} is not a value of this hierarchy's rewritten set") from None

    def coherence(self, embeddings: npt.ArrayLike, *, pairs: int = 20_000, seed: int = 0) -> float:
        """How often a pair inside a group is more similar than a pair across groups (the
        paper's cluster coherence: above 0.8 the model picks groups reliably), estimated on
        ``pairs`` random comparisons. ``embeddings``: one row per value, in
        :attr:`values` order."""
        values = self.values
        vectors = np.asarray(embeddings, dtype=np.float64)
        if vectors.ndim != 2 or len(vectors) != len(values):
            raise ValueSetError(f"embeddings must have shape ({len(values)}, d), got {vectors.shape}")
        unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        label_of = np.repeat(np.arange(len(self.groups)), [len(m) for m in self.groups.values()])
        rng = np.random.default_rng(seed)
        a, b, c, d = (rng.integers(0, len(values), pairs) for _ in range(4))
        # within pairs: b drawn from a's group; between pairs: c, d from different groups
        starts = np.concatenate(([0], np.cumsum([len(m) for m in self.groups.values()])))
        b = starts[label_of[a]] + (b % (starts[label_of[a] + 1] - starts[label_of[a]]))
        usable = (a != b) & (label_of[c] != label_of[d])
        if not usable.any():
            return float("nan")
        within = np.einsum("ij,ij->i", unit[a[usable]], unit[b[usable]])
        between = np.einsum("ij,ij->i", unit[c[usable]], unit[d[usable]])
        return float(np.mean(within > between))

    @property
    def values(self) -> list[str]:
        """The members, group by group (the order :meth:`coherence` expects)."""
        return [member for members in self.groups.values() for member in members]

    def stats(self) -> dict[str, Any]:
        sizes = [len(m) for m in self.groups.values()]
        return {
            "values": sum(sizes),
            "groups": len(sizes),
            "largest_group": max(sizes),
            "smallest_group": min(sizes),
            "cardinality": self.cardinality,
            "sqrt_k": math.ceil(math.sqrt(sum(sizes))),
        }

    def __repr__(self) -> str:
        return f"Hierarchy({len(self.groups)} groups, {len(self._member_of)} values, cardinality {self.cardinality})"


def _kmeans(
    unit: npt.NDArray[np.float64], k: int, seed: int, iterations: int
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]]:
    """Spherical k-means with a k-means++ start; empty clusters restart at the worst-fit point."""
    rng = np.random.default_rng(seed)
    centroids = np.empty((k, unit.shape[1]))
    centroids[0] = unit[rng.integers(len(unit))]
    distance = 1.0 - unit @ centroids[0]
    for i in range(1, k):
        weights = np.maximum(distance, 0) ** 2
        total = weights.sum()
        pick = rng.choice(len(unit), p=weights / total) if total > 0 else rng.integers(len(unit))
        centroids[i] = unit[pick]
        distance = np.minimum(distance, 1.0 - unit @ centroids[i])
    assignment = np.zeros(len(unit), dtype=np.intp)
    for iteration in range(iterations):
        similarity = unit @ centroids.T
        new = np.argmax(similarity, axis=1)
        for cluster in np.setdiff1d(np.arange(k), new):  # an empty cluster takes the worst-fit point
            worst = int(np.argmin(similarity[np.arange(len(unit)), new]))
            new[worst] = cluster
        if iteration and np.array_equal(new, assignment):
            break
        assignment = new
        sums = np.zeros_like(centroids)
        np.add.at(sums, assignment, unit)
        centroids = sums / np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-12)
    return assignment, centroids


class Shortlist:
    """Decode a large set in stages over a ranked shortlist, falling back to the full set.

    Stage ``i`` allows the top ``k * growth**i`` values by ``scores`` plus the reserved
    ``none`` string; an output equal to ``none`` moves to the next stage; the last stage
    is the whole set (no ``none``). So the answer is always a member, whatever the model
    writes, and a confident model finishes in the first stage at a cost of k choices.

    Parameters
    ----------
    values : iterable of str
        The full set.
    scores : array-like
        One score per distinct value (higher: more likely), e.g. the cosine similarity of
        the value's embedding to the prompt's.
    k : int
        The first stage's size (default 20).
    growth : int
        How much each stage grows (default 2: top-k, top-2k, ..., then all).
    max_stages : int
        Shortlist stages before the full set (default 2: top-k, top-2k, full).
    none : str
        The reserved continuation; it must not be a value.
    """

    def __init__(
        self,
        values: Iterable[str],
        scores: npt.ArrayLike,
        *,
        k: int = 20,
        growth: int = 2,
        max_stages: int = 2,
        none: str = "none of these",
    ) -> None:
        self.values = _distinct(values)
        ranked = np.asarray(scores, dtype=np.float64)
        if ranked.shape != (len(self.values),):
            raise ValueSetError(
                f"scores must have one entry per distinct value: shape ({len(self.values)},), got {ranked.shape}"
            )
        if np.isnan(ranked).any():
            raise ValueSetError(f"scores hold NaN at value #{int(np.flatnonzero(np.isnan(ranked))[0])}")
        k = integer(k, "k", ValueSetError, "a positive integer")
        growth = integer(growth, "growth", ValueSetError, "an integer >= 1")
        max_stages = integer(max_stages, "max_stages", ValueSetError, "an integer >= 0")
        if k < 1 or growth < 1 or max_stages < 0:
            raise ValueSetError(
                f"k, growth must be >= 1 and max_stages >= 0; got k={k}, growth={growth}, max_stages={max_stages}"
            )
        if not isinstance(none, str) or none in set(self.values):
            raise ValueSetError(f"none={none!r:.60} must be a str that is not a value")
        self.none = none
        order = np.argsort(-ranked, kind="stable")
        self._ranked = [self.values[i] for i in order]
        sizes = [k * growth**i for i in range(max_stages)]
        self.stage_sizes = [s for s in sizes if s < len(self.values)] + [len(self.values)]

    @property
    def num_stages(self) -> int:
        return len(self.stage_sizes)

    def stage_values(self, stage: int) -> list[str]:
        """The set of stage ``stage``: a shortlist plus ``none``, or (the last) all values."""
        stage = integer(stage, "stage", ValueSetError, "an int")
        if not 0 <= stage < self.num_stages:
            raise ValueSetError(f"stage must lie in [0, {self.num_stages}), got {stage}")
        if stage == self.num_stages - 1:
            return list(self.values)
        return [*self._ranked[: self.stage_sizes[stage]], self.none]

    def compile(self, compiler: Compiler, stage: int, **options: Any) -> TrieAutomaton:
        return compiler.compile(self.stage_values(stage), **options)

    def resolve(self, stage: int, output: str) -> str | None:
        """The member a stage's output names, or None to go on to the next stage."""
        allowed = self.stage_values(stage)
        if output == self.none and stage < self.num_stages - 1:
            return None
        if output not in set(allowed):
            raise ValueSetError(f"{output!r:.80} is not a value of stage {stage}")
        return output

    def run(self, decode: Callable[[list[str]], str]) -> tuple[str, int]:
        """Run the cascade with ``decode(stage_values) -> output`` (e.g. constrained
        generation over that set); returns the member and the stage that gave it."""
        for stage in range(self.num_stages):
            member = self.resolve(stage, decode(self.stage_values(stage)))
            if member is not None:
                return member, stage
        raise AssertionError("the last stage is the full set")  # pragma: no cover


def recall_at_k(values: Sequence[str], answers: Sequence[str], scores: npt.ArrayLike, k: int) -> float:
    """Fraction of queries whose answer is among the top ``k`` values by that query's
    scores (``scores``: one row per query, one column per value of ``values``)."""
    matrix = np.asarray(scores, dtype=np.float64)
    if matrix.shape != (len(answers), len(values)):
        raise ValueSetError(f"scores must have shape ({len(answers)}, {len(values)}), got {matrix.shape}")
    index = {value: i for i, value in enumerate(values)}
    missing = [answer for answer in answers if answer not in index]
    if missing:
        raise ValueSetError(f"answer {missing[0]!r:.60} is not a value")
    top = np.argsort(-matrix, axis=1, kind="stable")[:, :k]
    hits = [index[answer] in row for answer, row in zip(answers, top.tolist(), strict=True)]
    return float(np.mean(hits)) if hits else float("nan")
