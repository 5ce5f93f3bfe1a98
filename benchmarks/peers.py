"""Every engine behind one small interface, each driven through its own public API.

An :class:`Engine` is prepared once per vocabulary (the tokenizer-side work every
engine caches: xgrammar's ``TokenizerInfo``, llguidance's ``LLTokenizer``,
outlines-core's ``Vocabulary``, triemask's ``Compiler``), then compiles value
sets. ``compile`` runs until the first bitmask row is written, because lazy
engines (llguidance) do their work at the first mask: "time to first mask" is
the one definition that is fair to all of them.

A compiled set opens :class:`Request` objects (one decoding sequence each:
fill a bitmask row, advance by a token, reset), and fills batches with the
engine's own batch API where it has one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from triemask import Compiler, Matcher, TrieAutomaton, Vocabulary

# Regex metacharacters of the Rust `regex` syntax (llguidance, outlines-core). Rust rejects
# superfluous escapes of letters, digits and spaces, so Python's re.escape cannot be used.
_REGEX_META = re.compile(r"([\\.+*?()|\[\]{}^$#&\-~])")


def regex_union(values: Sequence[str]) -> str:
    """``(v1|v2|...)`` with every metacharacter escaped."""
    return "(" + "|".join(_REGEX_META.sub(r"\\\1", v) for v in values) + ")"


def ebnf_union(values: Sequence[str]) -> str:
    """xgrammar's EBNF alternation, as vLLM's ``choice`` builds it (JSON string escapes)."""
    return "root ::= " + " | ".join(json.dumps(v, ensure_ascii=False) for v in values)


def lark_union(values: Sequence[str]) -> str:
    """llguidance's Lark alternation."""
    return "start: " + " | ".join(json.dumps(v, ensure_ascii=False) for v in values)


class Request:
    """One decoding sequence of a compiled set."""

    def fill(self, bitmask: np.ndarray, row: int) -> None:
        raise NotImplementedError

    def advance(self, token: int) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError


class Engine:
    """An engine prepared for one vocabulary."""

    name: str
    #: whether its masks must equal triemask's (the token trie allows canonical tokenizations only)
    exact = True

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab

    def compile(self, values: list[str]) -> Any:
        """Compile ``values`` and write the first mask row (time to first mask)."""
        compiled = self.compile_only(values)
        bitmask = np.zeros((1, self.width), dtype=np.int32)
        self.request(compiled).fill(bitmask, 0)
        return compiled

    @property
    def width(self) -> int:
        return (self.vocab.vocab_size + 31) // 32

    def compile_only(self, values: list[str]) -> Any:
        raise NotImplementedError

    def request(self, compiled: Any) -> Request:
        raise NotImplementedError

    def batch_fill(self, requests: list[Any], bitmask: np.ndarray) -> None:
        """Fill row i from requests[i]; engines with a batch API override this."""
        for row, request in enumerate(requests):
            request.fill(bitmask, row)

    def batch_advance(self, requests: list[Any], tokens: list[int]) -> None:
        for request, token in zip(requests, tokens, strict=True):
            request.advance(token)

    def memory_bytes(self, compiled: Any) -> int | None:
        """The engine's own accounting of a compiled set, where it has one."""
        return None


def _encoded_vocabulary(vocab: Vocabulary) -> list[bytes]:
    """Bytes per id for peers; ids without bytes (special tokens) get an unmatchable placeholder."""
    return [vocab.token_bytes(i) or f"<|special_{i}|>".encode() for i in range(len(vocab))]


def _special_ids(vocab: Vocabulary) -> list[int]:
    return [i for i in range(len(vocab)) if vocab.token_bytes(i) is None]


# --- triemask ---------------------------------------------------------------------------------


class _TriemaskMatcherRequest(Request):
    """The per-request API, the same loop as xgrammar's ``GrammarMatcher``."""

    __slots__ = ("matcher",)

    def __init__(self, automaton: TrieAutomaton) -> None:
        self.matcher = Matcher(automaton)

    def fill(self, bitmask: np.ndarray, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def advance(self, token: int) -> None:
        if not self.matcher.accept_token(token):
            raise AssertionError(f"triemask rejected token {token}")

    def reset(self) -> None:
        self.matcher.reset()


class _TriemaskAutomatonRequest(Request):
    """The stateless API: ``fill_bitmask`` + ``next_state`` on a state id."""

    __slots__ = ("automaton", "state")

    def __init__(self, automaton: TrieAutomaton) -> None:
        self.automaton = automaton
        self.state = automaton.initial_state

    def fill(self, bitmask: np.ndarray, row: int) -> None:
        self.automaton.fill_bitmask(bitmask, (self.state,), rows=None if row == 0 else (row,))

    def advance(self, token: int) -> None:
        self.state = self.automaton.next_state(self.state, token)

    def reset(self) -> None:
        self.state = self.automaton.initial_state


class TriemaskEngine(Engine):
    name = "triemask"
    layout = "trie"  # the large-set benchmark also measures layout="lazy"

    def __init__(self, vocab: Vocabulary) -> None:
        super().__init__(vocab)
        self.compiler = Compiler(vocab)

    def compile_only(self, values: list[str]) -> TrieAutomaton:
        return self.compiler.compile(values, layout=self.layout)

    def request(self, compiled: TrieAutomaton) -> _TriemaskAutomatonRequest:
        return _TriemaskAutomatonRequest(compiled)

    def matcher_request(self, compiled: TrieAutomaton) -> _TriemaskMatcherRequest:
        """A request through ``Matcher`` (the per-step figure; ``request`` is the stateless API)."""
        return _TriemaskMatcherRequest(compiled)

    # The automaton is stateless: a batch is one call over B state ids.
    def batch_fill(self, requests: list[Any], bitmask: np.ndarray) -> None:
        requests[0].automaton.fill_bitmask(bitmask, [r.state for r in requests])

    def batch_advance(self, requests: list[Any], tokens: list[int]) -> None:
        states = [r.state for r in requests]
        for request, state in zip(requests, requests[0].automaton.next_states(states, tokens).tolist(), strict=True):
            request.state = state

    def memory_bytes(self, compiled: TrieAutomaton) -> int:
        return compiled.memory_bytes


# --- xgrammar ---------------------------------------------------------------------------------


class _XGrammarRequest(Request):
    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher

    def fill(self, bitmask: np.ndarray, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def advance(self, token: int) -> None:
        if not self.matcher.accept_token(token):
            raise AssertionError(f"xgrammar rejected token {token}")

    def reset(self) -> None:
        self.matcher.reset()


class XGrammarEngine(Engine):
    """xgrammar with the EBNF alternation vLLM's ``choice`` compiles; cache off so repeats recompile."""

    name = "xgrammar"

    def __init__(self, vocab: Vocabulary) -> None:
        import xgrammar

        super().__init__(vocab)
        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo(
            _encoded_vocabulary(vocab),
            xgrammar.VocabType.RAW,
            vocab_size=vocab.vocab_size,
            stop_token_ids=list(vocab.eos_token_ids),
        )
        self.compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
        self.batcher = xgrammar.BatchGrammarMatcher()

    def compile_only(self, values: list[str]) -> Any:
        return self.compiler.compile_grammar(ebnf_union(values))

    def request(self, compiled: Any) -> _XGrammarRequest:
        return _XGrammarRequest(self.xgr.GrammarMatcher(compiled))

    def batch_fill(self, requests: list[Any], bitmask: np.ndarray) -> None:
        self.batcher.batch_fill_next_token_bitmask([r.matcher for r in requests], bitmask)

    def batch_advance(self, requests: list[Any], tokens: list[int]) -> None:
        self.batcher.batch_accept_token([r.matcher for r in requests], tokens)

    def memory_bytes(self, compiled: Any) -> int:
        return int(compiled.memory_size_bytes)


# --- llguidance -------------------------------------------------------------------------------


class ByteTokenizer:
    """What ``llguidance.TokenizerWrapper`` reads: token bytes, EOS, and a tokenize function.

    llguidance only tokenizes grammar-forced text with it; a greedy longest match over
    the vocabulary is enough for that (it never affects which tokens a mask allows).
    """

    def __init__(self, vocab: Vocabulary) -> None:
        # Padded to the model's width, so that llguidance's bitmask has the same shape as everyone's.
        padding = [f"<|unused_{i}|>".encode() for i in range(len(vocab), vocab.vocab_size)]
        self.tokens = _encoded_vocabulary(vocab) + padding
        self.special_token_ids = _special_ids(vocab) + list(range(len(vocab), vocab.vocab_size))
        self.eos_token_id = vocab.eos_token_ids[0]
        self.bos_token_id = None
        specials = set(self.special_token_ids)
        self._ids = {t: i for i, t in enumerate(self.tokens) if i not in specials}
        self._longest = max(map(len, self._ids))

    def __call__(self, text: bytes) -> list[int]:
        ids, position = [], 0
        while position < len(text):
            for end in range(min(len(text), position + self._longest), position, -1):
                token = self._ids.get(text[position:end])
                if token is not None:
                    ids.append(token)
                    position = end
                    break
            else:
                raise ValueError(f"no token for byte {text[position]:#x}")
        return ids


class _LLGuidanceRequest(Request):
    def __init__(self, matcher: Any, numpy_api: Any) -> None:
        self.matcher = matcher
        self.np_api = numpy_api

    def fill(self, bitmask: np.ndarray, row: int) -> None:
        self.np_api.fill_next_token_bitmask(self.matcher, bitmask, row)

    def advance(self, token: int) -> None:
        self.matcher.consume_token(token)
        if self.matcher.is_error():
            raise AssertionError(f"llguidance rejected token {token}: {self.matcher.get_error()}")

    def reset(self) -> None:
        self.matcher.reset()


class LLGuidanceEngine(Engine):
    """llguidance with the escaped regex union (its fastest form here)."""

    name = "llguidance"
    syntax = "regex"

    def __init__(self, vocab: Vocabulary) -> None:
        import llguidance
        import llguidance.numpy

        super().__init__(vocab)
        self.ll = llguidance
        self.np_api = llguidance.numpy
        self.tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(ByteTokenizer(vocab)))
        self.executor = llguidance.LLExecutor()

    def compile_only(self, values: list[str]) -> Any:
        if self.syntax == "regex":
            return self.ll.LLMatcher.grammar_from_regex(regex_union(values))
        return self.ll.LLMatcher.grammar_from_lark(lark_union(values))

    def request(self, compiled: Any) -> _LLGuidanceRequest:
        matcher = self.ll.LLMatcher(self.tokenizer, compiled)
        if matcher.is_error():
            raise RuntimeError(f"llguidance: {matcher.get_error()}")
        return _LLGuidanceRequest(matcher, self.np_api)

    def batch_fill(self, requests: list[Any], bitmask: np.ndarray) -> None:
        self.np_api.fill_next_token_bitmask_par(
            self.executor, [(r.matcher, i) for i, r in enumerate(requests)], bitmask
        )


class LLGuidanceLarkEngine(LLGuidanceEngine):
    """llguidance with the Lark alternation ``start: "v1" | "v2" | ...``."""

    name = "llguidance-lark"
    syntax = "lark"


# --- outlines-core ----------------------------------------------------------------------------


class _OutlinesRequest(Request):
    def __init__(self, guide: Any, width: int, eos: int) -> None:
        self.guide = guide
        self.width = width
        self.eos = eos

    def fill(self, bitmask: np.ndarray, row: int) -> None:
        self.guide.write_mask_into(bitmask[row].ctypes.data, self.width, 4)

    def advance(self, token: int) -> None:
        # outlines-core allows EOS in final states but has no transition for it: the sequence just ends.
        if token != self.eos:
            self.guide.advance(token, return_tokens=False)

    def reset(self) -> None:
        self.guide.reset()


class OutlinesCoreEngine(Engine):
    """outlines-core: a regex index over the vocabulary (the whole DFA x vocabulary walk upfront)."""

    name = "outlines-core"

    def __init__(self, vocab: Vocabulary) -> None:
        import outlines_core

        super().__init__(vocab)
        self.oc = outlines_core
        eos = vocab.eos_token_ids[0]
        tokens: dict[bytes, list[int]] = {}
        for i in range(len(vocab)):
            token = vocab.token_bytes(i)
            if token is not None and i != eos:
                tokens.setdefault(token, []).append(i)
        self.vocabulary = outlines_core.Vocabulary(eos, tokens)

    def compile_only(self, values: list[str]) -> Any:
        return self.oc.Index(regex_union(values), self.vocabulary)

    def request(self, compiled: Any) -> _OutlinesRequest:
        return _OutlinesRequest(self.oc.Guide(compiled), self.width, self.vocab.eos_token_ids[0])


# --- a GENRE-style token trie (paper, appendix H.8) -------------------------------------------


class TokenTrie:
    """GENRE's prefix tree over the canonical tokenizations of the values.

    ``children[node]`` maps a token id to the next node; a value's last token leads to
    a node whose children hold EOS. Only the tokenizer's own tokenization of each
    value is allowed, so its masks are a subset of triemask's (paper, H.8).
    """

    def __init__(self, sequences: list[list[int]], eos: int) -> None:
        self.children: list[dict[int, int]] = [{}]
        for sequence in sequences:
            node = 0
            for token in [*sequence, eos]:
                child = self.children[node].get(token)
                if child is None:
                    child = len(self.children)
                    self.children[node][token] = child
                    self.children.append({})
                node = child


class _TokenTrieRequest(Request):
    __slots__ = ("node", "trie")

    def __init__(self, trie: TokenTrie) -> None:
        self.trie = trie
        self.node = 0

    def fill(self, bitmask: np.ndarray, row: int) -> None:
        ids = np.fromiter(self.trie.children[self.node], np.int64)
        words = bitmask[row]
        words.fill(0)
        np.bitwise_or.at(words, ids >> 5, (np.int64(1) << (ids & 31)).astype(np.uint32).view(np.int32))

    def advance(self, token: int) -> None:
        self.node = self.trie.children[self.node][token]

    def reset(self) -> None:
        self.node = 0


class TokenTrieEngine(Engine):
    """GENRE-style token trie: tokenize every value, insert the id sequences in a dict trie."""

    name = "token-trie"
    exact = False

    def __init__(self, vocab: Vocabulary, encode: Callable[[list[str]], list[list[int]]]) -> None:
        super().__init__(vocab)
        self.encode = encode

    def compile_only(self, values: list[str]) -> TokenTrie:
        return TokenTrie(self.encode(values), self.vocab.eos_token_ids[0])

    def request(self, compiled: TokenTrie) -> _TokenTrieRequest:
        return _TokenTrieRequest(compiled)


ENGINES: dict[str, type[Engine]] = {
    engine.name: engine
    for engine in (TriemaskEngine, XGrammarEngine, LLGuidanceEngine, LLGuidanceLarkEngine, OutlinesCoreEngine)
}
PEER_PACKAGES = {
    "xgrammar": "xgrammar",
    "llguidance": "llguidance",
    "llguidance-lark": "llguidance",
    "outlines-core": "outlines_core",
}
