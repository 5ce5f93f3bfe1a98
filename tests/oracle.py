"""A first-principles oracle for allowed-token sets, independent of triemask's algorithm.

Token ``t`` is allowed after the prefix ``p`` iff ``p + bytes(t)`` is a prefix of
some value and, from there, some sequence of text tokens completes a value
("live"); EOS is allowed iff ``p`` is a value. With a vocabulary in which every
byte of the values is a token, every prefix is live and the rule reduces to the
paper's: ``p + bytes(t)`` is a prefix of some value.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from triemask import DEAD, TrieAutomaton


def tokens_by_bytes(token_bytes: Sequence[bytes | None], eos_ids: Iterable[int] = ()) -> dict[bytes, list[int]]:
    """Text token ids grouped by the bytes they emit."""
    eos = set(eos_ids)
    by_bytes: dict[bytes, list[int]] = defaultdict(list)
    for i, b in enumerate(token_bytes):
        if b and i not in eos:
            by_bytes[b].append(i)
    return by_bytes


class Oracle:
    def __init__(
        self,
        token_bytes: Sequence[bytes | None],
        values: Iterable[bytes],
        eos_ids: Sequence[int],
        by_bytes: dict[bytes, list[int]] | None = None,
    ) -> None:
        self.values = set(values)
        self.eos_ids = set(eos_ids)
        self.by_bytes = tokens_by_bytes(token_bytes, eos_ids) if by_bytes is None else by_bytes
        self.prefixes = {v[:i] for v in self.values for i in range(len(v) + 1)}
        self.extensions: dict[bytes, list[bytes]] = defaultdict(list)  # prefix -> longer prefixes
        for q in self.prefixes:
            for i in range(len(q)):
                self.extensions[q[:i]].append(q)
        self.live = self._live()

    def _live(self) -> set[bytes]:
        """Prefixes from which some token sequence reaches a value (longest first)."""
        live: set[bytes] = set()
        for p in sorted(self.prefixes, key=len, reverse=True):
            if p in self.values or any(q in live and q[len(p) :] in self.by_bytes for q in self.extensions.get(p, ())):
                live.add(p)
        return live

    def allowed(self, prefix: bytes, *, eos: bool = True) -> set[int]:
        out: set[int] = set()
        for q in self.extensions.get(prefix, ()):
            if q in self.live:
                out.update(self.by_bytes.get(q[len(prefix) :], ()))
        if eos and prefix in self.values:
            out |= self.eos_ids
        return out


def explore(automaton: TrieAutomaton, token_bytes: Sequence[bytes | None]) -> dict[int, bytes]:
    """Every state reachable from the initial one, with the bytes it has consumed.

    Checks on the way that two paths into one state consumed the same bytes.
    """
    eos = set(automaton.eos_token_ids)
    seen = {automaton.initial_state: b""}
    stack = [automaton.initial_state]
    while stack:
        state = stack.pop()
        for token in automaton.allowed_token_ids(state).tolist():
            following = automaton.next_state(state, token)
            assert following != DEAD, (state, token)
            consumed = seen[state] if token in eos else seen[state] + (token_bytes[token] or b"")
            if following in seen:
                assert seen[following] == consumed, (state, token, seen[following], consumed)
            else:
                seen[following] = consumed
                stack.append(following)
    return seen


def bitmask_tokens(row: np.ndarray, vocab_size: int) -> set[int]:
    """Token ids whose bit is set in one bitmask row."""
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")[:vocab_size]
    padding = np.unpackbits(row.view(np.uint8), bitorder="little")[vocab_size:]
    assert not padding.any(), "bits set past vocab_size"
    return set(np.flatnonzero(bits).tolist())


def check_against_oracle(
    automaton: TrieAutomaton,
    token_bytes: Sequence[bytes | None],
    values: Iterable[bytes],
    eos_ids: Sequence[int],
    by_bytes: dict[bytes, list[int]] | None = None,
) -> dict[int, bytes]:
    """Compare masks with the oracle at every reachable state; return the states."""
    oracle = Oracle(token_bytes, values, eos_ids, by_bytes)
    states = explore(automaton, token_bytes)
    node_prefixes = {p for s, p in states.items() if not automaton.is_final(s)}
    assert node_prefixes == {p for p in oracle.prefixes if p in oracle.live} - _unreachable(oracle)
    bitmask = np.zeros((1, (automaton.vocab_size + 31) // 32), dtype=np.int32)
    for state, prefix in states.items():
        got = set(automaton.allowed_token_ids(state).tolist())
        expected = set() if automaton.is_final(state) else oracle.allowed(prefix, eos=automaton.eos)
        assert got == expected, (prefix, sorted(got - expected)[:8], sorted(expected - got)[:8])
        automaton.fill_bitmask(bitmask, [state])
        assert bitmask_tokens(bitmask[0], automaton.vocab_size) == expected
        if not automaton.is_final(state):
            assert automaton.is_accepting(state) == (prefix in oracle.values)
            assert automaton.value_of(state) in (None, prefix, prefix.decode("utf-8", "replace"))
    return states


def _unreachable(oracle: Oracle) -> set[bytes]:
    """Live prefixes no token sequence from the empty prefix lands on exactly."""
    reached = {b""}
    frontier = [b""]
    while frontier:
        p = frontier.pop()
        for q in oracle.extensions.get(p, ()):
            if q in oracle.live and q not in reached and q[len(p) :] in oracle.by_bytes:
                reached.add(q)
                frontier.append(q)
    return {p for p in oracle.live if p not in reached}


def strict_json_prefix(data: bytes) -> bool:
    """Whether ``data`` can begin a strict JSON text (RFC 8259) as far as its characters go:
    UTF-8 that some continuation bytes complete (no surrogate, no byte that is never UTF-8),
    no raw control character inside a string and none but whitespace outside one. The
    grammar's part is xgrammar's; this is the part where xgrammar is looser than JSON."""
    completions = [b""] + [bytes([first]) + b"\x80" * more for more in range(3) for first in (0x80, 0x90, 0xA0)]
    for completion in completions:  # an incomplete last character: try to complete it
        try:
            text = (data + completion).decode("utf-8")
            break
        except UnicodeDecodeError:
            continue
    else:
        return False
    in_string = escaped = False
    for char in text:
        if char < " " and (in_string or char not in "\t\n\r"):
            return False
        if escaped:
            escaped = False
        elif in_string and char == "\\":
            escaped = True
        elif char == '"':
            in_string = not in_string
    return True
