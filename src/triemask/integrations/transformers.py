"""Hugging Face transformers: keep every generated sequence inside a set.

>>> processor = TrieLogitsProcessor(automaton)  # doctest: +SKIP
>>> model.generate(input_ids, logits_processor=[processor], eos_token_id=automaton.eos_token_ids)  # doctest: +SKIP

The processor is stateless in the sense that matters for ``generate``: each row's
state is derived from that row's own generated tokens at every call, so greedy search,
sampling and beam search (which reorders rows between calls) are all constrained
correctly. All rows are masked at once: one lookup of the allowed (row, token) pairs,
then one gather and one scatter, so the cost follows the allowed tokens, not the vocabulary.
"""

from __future__ import annotations

import copy
import inspect
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..automata import DEAD, DagAutomaton, LazyDagAutomaton, TrieAutomaton
from ..base import ArgumentTypeError, BitmaskError, BoundedLRU, StateError, VocabularyError
from ..cache import default_compile_cache
from ..compiler import Compiler
from ..matcher import Matcher
from ..schemas import CompiledSchema, SchemaMatcher, allowed_token_rows, constraint_of_request
from ..vocab import Vocabulary

try:
    import torch
    from transformers import (
        LogitsProcessor,
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )
except ImportError as error:  # pragma: no cover - exercised only without the extras
    raise ImportError(
        "triemask.integrations.transformers needs torch and transformers: "
        "pip install torch==2.13.0 'triemask[transformers]'"
    ) from error

__all__ = [
    "Decoded",
    "TrieLogitsProcessor",
    "choose",
    "compiler_for",
    "generate_constrained",
    "generate_json",
    "model_eos_token_ids",
    "render_prompt",
    "spelled_value",
]


def _extends(ids: npt.NDArray[np.int64], previous: npt.NDArray[np.int64]) -> bool:
    """Whether every row of ``ids`` is some row of ``previous`` plus one token (rows
    reordered or repeated between calls, as beam search does)."""
    if ids.shape[0] != previous.shape[0] or ids.shape[1] != previous.shape[1] + 1:
        return False
    rows = {row.tobytes() for row in previous}
    return all(row.tobytes() in rows for row in ids[:, :-1])


class TrieLogitsProcessor(LogitsProcessor):  # type: ignore[misc,unused-ignore]  # Any without transformers
    """A ``LogitsProcessor`` that allows, in every row, only tokens that keep the
    row's generated text a prefix of a value of ``automaton`` (and EOS once a value
    is complete).

    With a :class:`~triemask.CompiledSchema` (a JSON schema or a tool list) instead,
    every row's text stays a prefix of an instance of the schema: each row keeps a
    :class:`~triemask.SchemaMatcher`, advanced by the row's new token (copied when beam
    search reorders rows), and the rows' masks are filled in one call.

    Parameters
    ----------
    automaton : TrieAutomaton or CompiledSchema
        The compiled set (or schema); its ``vocab_size`` must not exceed the model's logits width.
    prompt_length : int, optional
        Where generation starts in ``input_ids`` (the padded prompt length). By
        default the length seen at the first call; a call that does not extend the
        previous call's ``input_ids`` by one token starts a new generation, so one
        processor can serve successive ``generate`` calls.

    Notes
    -----
    A row whose value is complete and that has emitted EOS (or a row a token outside
    the set was forced into) allows only EOS, so a finished row never has all of its
    logits at ``-inf``.

    Attributes
    ----------
    steps : int
        Calls so far (one per generated token position).
    mask_seconds : float
        Time spent in those calls: deriving the row states and masking the logits.
    """

    def __init__(self, automaton: TrieAutomaton | CompiledSchema, *, prompt_length: int | None = None) -> None:
        if not isinstance(automaton, TrieAutomaton | CompiledSchema):
            raise ArgumentTypeError(
                f"TrieLogitsProcessor needs a TrieAutomaton or a CompiledSchema, got {type(automaton).__qualname__}"
            )
        self._matchers: list[SchemaMatcher | None] = []  # per row, with a CompiledSchema
        if not automaton.eos_token_ids:
            raise VocabularyError("the automaton's vocabulary has no EOS token ids: generation could never stop")
        self.automaton = automaton
        self._fixed_start = prompt_length
        self._start = prompt_length if prompt_length is not None else -1
        self._previous: npt.NDArray[np.int64] | None = None  # the previous call's input_ids
        self._states: npt.NDArray[np.int64] | None = None  # the states the previous call's rows reached
        self._tracked = False  # whether the previous call's rows were followed to their states
        self._eos = np.asarray(automaton.eos_token_ids, dtype=np.int64)
        self.steps = 0
        self.mask_seconds = 0.0

    @classmethod
    def from_request(
        cls,
        compiler: Compiler,
        *,
        response_format: Any = None,
        tools: Any = None,
        tool_choice: Any = None,
        prompt_length: int | None = None,
        **options: Any,
    ) -> TrieLogitsProcessor:
        """A processor for the fields of an OpenAI chat request (as :func:`generate_json` reads
        them: :func:`triemask.schemas.constraint_of_request`), compiled with ``compiler``
        (``options``: :meth:`Compiler.compile_json_schema`'s) through the process's compile
        cache. A request that leaves the answer free raises ``ArgumentTypeError``."""
        constraint = _constraint(None, response_format, tools, tool_choice)
        compiled = default_compile_cache().compile_schema(
            compiler, constraint, tools=isinstance(constraint, list), **options
        )
        return cls(compiled, prompt_length=prompt_length)

    def _rows(self, input_ids: Any) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64] | None, bool]:
        """Every row's tokens, the previous call's rows, and whether each row is the
        previous call's row of the same index plus one token."""
        length = int(input_ids.shape[1])
        ids = input_ids.detach().cpu().numpy().astype(np.int64, copy=False)
        previous, tracked = self._previous, self._tracked
        self._previous, self._tracked = ids.copy(), False
        # the previous call's rows, in the same order, each one token longer: one step on
        in_order = (
            previous is not None
            and tracked
            and previous.shape == (ids.shape[0], length - 1)
            and np.array_equal(ids[:, :-1], previous)
        )
        if not in_order and self._fixed_start is None and (previous is None or not _extends(ids, previous)):
            self._start = length  # a new generation (not merely rows reordered by beam search)
        if not 0 <= self._start <= length:
            raise StateError(f"prompt_length={self._start} is outside input_ids of length {length}")
        return ids, previous, in_order

    def states(self, input_ids: Any) -> npt.NDArray[np.int64]:
        """The automaton state of every row of ``input_ids`` (batch, sequence length)."""
        if not isinstance(self.automaton, TrieAutomaton):
            raise ArgumentTypeError("states() is for a TrieAutomaton; a CompiledSchema keeps SchemaMatcher rows")
        ids, _, in_order = self._rows(input_ids)
        generated = ids[:, self._start :]
        states = self._states
        if in_order and states is not None and generated.shape[1]:
            states = self._advance(states, generated[:, -1])
        else:  # a new generation, or rows reordered: walk every row from the start
            states = np.full(generated.shape[0], self.automaton.initial_state, dtype=np.int64)
            for column in generated.T:
                states = self._advance(states, column)
        self._states, self._tracked = states, True
        return states

    def matchers(self, input_ids: Any) -> list[SchemaMatcher | None]:
        """With a CompiledSchema: every row's matcher (None for a row a token outside
        the schema was forced into)."""
        if not isinstance(self.automaton, CompiledSchema):
            raise ArgumentTypeError("matchers() is for a CompiledSchema; a TrieAutomaton has integer states")
        ids, previous, in_order = self._rows(input_ids)
        generated = ids[:, self._start :]
        found: list[SchemaMatcher | None]
        if in_order and generated.shape[1]:  # one token on, in place
            found = [
                _step(matcher, int(token)) for matcher, token in zip(self._matchers, generated[:, -1], strict=True)
            ]
        elif previous is not None and generated.shape[1] and _extends(ids, previous):
            # beam search reordered (or repeated) rows: copy the matcher of each row's parent
            parents = {row.tobytes(): i for i, row in enumerate(previous)}
            found = []
            for row in ids:
                parent = self._matchers[parents[row[:-1].tobytes()]]
                found.append(_step(None if parent is None else parent.copy(), int(row[-1])))
        else:  # a new generation: every row from the start
            found = []
            for row in generated:
                matcher: SchemaMatcher | None = SchemaMatcher(self.automaton)
                for token in row.tolist():
                    matcher = _step(matcher, token)
                found.append(matcher)
        self._matchers, self._tracked = found, True
        return found

    def _ended(self, states: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Rows that are final (EOS emitted) or dead: nothing of the set can follow."""
        assert isinstance(self.automaton, TrieAutomaton)
        ended: npt.NDArray[np.bool_] = (states == DEAD) | (states >= self.automaton.num_nodes)
        return ended

    def _advance(self, states: npt.NDArray[np.int64], tokens: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """One token for every row; a finished (final) or dead row stays as it is."""
        stays = self._ended(states)
        assert isinstance(self.automaton, TrieAutomaton)
        following = self.automaton.next_states(np.where(stays, DEAD, states), tokens).astype(np.int64)
        return np.where(stays, states, following)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        started = time.perf_counter()
        batch, width = int(scores.shape[0]), int(scores.shape[-1])
        if self.automaton.vocab_size > width:
            raise BitmaskError(
                f"the automaton has vocab_size={self.automaton.vocab_size} but the logits have only {width} "
                "columns: build the Vocabulary with the model's vocab_size"
            )
        if isinstance(self.automaton, CompiledSchema):
            masked = self._mask_schema_rows(input_ids, scores)
            self.steps += 1
            self.mask_seconds += time.perf_counter() - started
            return masked
        states = self.states(input_ids)
        if len(states) != batch:
            raise BitmaskError(f"input_ids has {len(states)} rows but scores has {batch}")
        # gather and scatter over the allowed (row, token) pairs: no vocabulary-wide pass but the fill
        rows, tokens = self.automaton.allowed_token_pairs(states)
        ended = np.flatnonzero(self._ended(states))
        if ended.size:  # finished rows: EOS only
            rows = np.concatenate([rows, np.repeat(ended, len(self._eos))])
            tokens = np.concatenate([tokens, np.tile(self._eos, len(ended))])
        where = (torch.from_numpy(rows).to(scores.device), torch.from_numpy(tokens.astype(np.int64)).to(scores.device))
        masked = torch.full_like(scores, float("-inf"))
        masked[where] = scores[where]
        self.steps += 1
        self.mask_seconds += time.perf_counter() - started
        return masked

    def _mask_schema_rows(self, input_ids: Any, scores: Any) -> Any:
        matchers = self.matchers(input_ids)
        batch, width = int(scores.shape[0]), int(scores.shape[-1])
        if len(matchers) != batch:
            raise BitmaskError(f"input_ids has {len(matchers)} rows but scores has {batch}")
        keep = torch.from_numpy(allowed_token_rows(matchers, self._eos, width))  # finished rows: EOS only
        return scores.masked_fill(~keep.to(scores.device), float("-inf"))


def _step(matcher: SchemaMatcher | None, token: int) -> SchemaMatcher | None:
    """``matcher`` after ``token``: a finished row stays finished (padding follows EOS),
    a rejected token ends the row (None)."""
    if matcher is None or matcher.is_terminated():
        return matcher
    return matcher if matcher.accept_token(token) else None


# per vocabulary fingerprint: the index is built once (a few models per process: bounded by count)
_COMPILERS: BoundedLRU[str, Compiler] = BoundedLRU(8)
_COMPILERS_LOCK = threading.Lock()
_BY_TOKENIZER: weakref.WeakKeyDictionary[Any, tuple[tuple[Any, ...], Compiler]] = weakref.WeakKeyDictionary()


def choose(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    values: Iterable[str],
    *,
    system: str | None = None,
    leading_space: bool = False,
    batch_size: int = 8,
    jump_forward: bool | str = False,
    **generate_kwargs: Any,
) -> list[str]:
    """Ask ``model`` each prompt and return, for each, one member of ``values``.

    Parameters
    ----------
    model, tokenizer
        A transformers causal LM and its tokenizer.
    prompts : list of str
        User messages. The tokenizer's chat template is applied when it has one
        (with ``system`` as the system message); otherwise the prompt is the text.
    values : iterable of str
        The allowed answers.
    leading_space : bool
        Also allow each value preceded by one space (SentencePiece-style models often
        start an answer with ``▁Paris``); the space is stripped from the result.
    batch_size : int
        Prompts per ``generate`` call (left-padded).
    jump_forward : bool or "canonical"
        Decode in triemask's own loop (:func:`generate_constrained`), one prompt at a time,
        putting the text every value continuing from there shares (the rest of a name once
        its prefix is unique) in the forward pass of the model's next token: ``True``, the
        answers are those of decoding without jumps, in fewer passes; ``"canonical"``, fewer
        again, members still, but the model reads the tokenizer's spelling of that text.
    **generate_kwargs
        Passed to ``model.generate`` (greedy by default; ``do_sample=True`` samples).
        ``logits_processor`` entries run before the set constraint.

    Returns
    -------
    list of str
        One member of ``values`` per prompt, in order.
    """
    if isinstance(prompts, str):
        raise ArgumentTypeError("prompts must be a list of strings; wrap a single prompt in a list")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    allowed = list(values)
    members = set(allowed)
    if leading_space:
        allowed += [" " + value for value in allowed]
    automaton = default_compile_cache().compile(compiler_for(model, tokenizer), allowed)
    longest = max(len(value.encode()) for value in allowed)
    options: dict[str, Any] = {"do_sample": False, "max_new_tokens": longest + 1}  # a token spells >= 1 byte
    options.update(generate_kwargs)
    answers: list[str] = []
    for index, row in enumerate(
        _constrained_rows(model, tokenizer, prompts, automaton, system, batch_size, options, jump_forward)
    ):
        value = spelled_value(automaton, row)
        if value is None:
            raise RuntimeError(
                f"generation for prompt {index} stopped before completing a value "
                f"(max_new_tokens={options['max_new_tokens']}); raise max_new_tokens"
            )
        answers.append(value[1:] if leading_space and value not in members else value)
    return answers


def _constrained_rows(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    constraint: TrieAutomaton | CompiledSchema,
    system: str | None,
    batch_size: int,
    options: dict[str, Any],
    jump_forward: bool | str,
) -> list[list[int]]:
    """The generated token ids of each prompt (chat template applied), every row constrained
    by ``constraint``: ``model.generate`` in left-padded batches, or triemask's own loop with
    jump-forward."""
    if jump_forward:
        decoded = generate_constrained(model, tokenizer, prompts, constraint, system=system, **options)
        return [d.tokens for d in decoded]
    eos = model_eos_token_ids(model, tokenizer)
    options = dict(options)
    extra = list(options.pop("logits_processor", None) or [])
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    rows: list[list[int]] = []
    for first in range(0, len(prompts), batch_size):
        batch = [render_prompt(tokenizer, prompt, system) for prompt in prompts[first : first + batch_size]]
        encoded = _encode_left_padded(tokenizer, batch).to(model.device)
        start = int(encoded["input_ids"].shape[1])
        processors = LogitsProcessorList([*extra, TrieLogitsProcessor(constraint, prompt_length=start)])
        output = model.generate(
            **encoded, logits_processor=processors, eos_token_id=list(eos), pad_token_id=pad, **options
        )
        rows.extend(output[:, start:].tolist())
    return rows


def generate_json(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    schema_or_tools: Any = None,
    *,
    response_format: Any = None,
    tools: Any = None,
    tool_choice: Any = None,
    system: str | None = None,
    batch_size: int = 8,
    max_new_tokens: int = 256,
    any_whitespace: bool = False,
    jump_forward: bool | str = False,
    **generate_kwargs: Any,
) -> list[Any]:
    """Ask ``model`` each prompt and return, for each, a parsed JSON object valid for
    ``schema_or_tools``.

    Parameters
    ----------
    model, tokenizer
        A transformers causal LM and its tokenizer.
    prompts : list of str
        User messages (the chat template is applied as in :func:`choose`).
    schema_or_tools : dict, str, pydantic model class, list of tool specs, or CompiledSchema
        A JSON schema, or OpenAI-style function specs (the output is then
        ``{"name": ..., "arguments": ...}``), or one compiled already. Or, instead:
    response_format, tools, tool_choice
        The fields of an OpenAI chat request, read as the serving engines read them
        (:func:`triemask.schemas.constraint_of_request`): ``response_format={"type":
        "json_schema", "json_schema": {"schema": ...}}`` or ``{"type": "json_object"}``;
        ``tools=[...]`` with ``tool_choice="required"`` (one call, as with a tool list above)
        or a named function (its arguments).
    max_new_tokens : int
        The budget per answer; an answer not complete within it raises.
    any_whitespace : bool
        Allow free whitespace between JSON tokens (default: xgrammar's compact layout).
    jump_forward : bool or "canonical"
        Decode in triemask's own loop (:func:`generate_constrained`), putting what the schema
        forces (``{"name": "``, the rest of a tool name, ``", "arguments": {"query": "``) in the
        forward pass of the model's next token; as for :func:`choose`.
    **generate_kwargs
        Passed to ``model.generate`` (greedy by default).

    Returns
    -------
    list
        One parsed object per prompt, in order.
    """
    if isinstance(prompts, str):
        raise ArgumentTypeError("prompts must be a list of strings; wrap a single prompt in a list")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    compiled = _constraint(schema_or_tools, response_format, tools, tool_choice)
    if not isinstance(compiled, CompiledSchema):
        # through the process's compile cache: the same plain-JSON schema is compiled once
        compiled = default_compile_cache().compile_schema(
            compiler_for(model, tokenizer), compiled, tools=isinstance(compiled, list), any_whitespace=any_whitespace
        )
    options: dict[str, Any] = {"do_sample": False, "max_new_tokens": max_new_tokens}
    options.update(generate_kwargs)
    eos = model_eos_token_ids(model, tokenizer)
    answers: list[Any] = []
    for index, row in enumerate(
        _constrained_rows(model, tokenizer, prompts, compiled, system, batch_size, options, jump_forward)
    ):
        matcher = SchemaMatcher(compiled)
        for token in row:
            if token in eos or not matcher.accept_token(token):
                break
        if matcher.value is None:
            raise RuntimeError(
                f"generation for prompt {index} stopped before the JSON was complete "
                f"(max_new_tokens={options['max_new_tokens']}): raise max_new_tokens; text so far "
                f"{matcher.text[:200]!r}"
            )
        answers.append(matcher.value)
    return answers


def _constraint(schema_or_tools: Any, response_format: Any, tools: Any, tool_choice: Any) -> Any:
    """What :func:`generate_json` compiles: ``schema_or_tools``, or the request fields'
    constraint (never both, never neither)."""
    request = {"response_format": response_format, "tools": tools, "tool_choice": tool_choice}
    given = [name for name, value in request.items() if value is not None]
    if schema_or_tools is not None:
        if given:
            raise ArgumentTypeError(
                f"give schema_or_tools or the request fields ({', '.join(given)}), not both: one constraint at a time"
            )
        return schema_or_tools
    constraint = constraint_of_request(response_format=response_format, tools=tools, tool_choice=tool_choice)
    if constraint is None:
        raise ArgumentTypeError(
            "generate_json needs a constraint: schema_or_tools, a json_schema or json_object response_format, "
            f"or tools with tool_choice 'required' or a named function (got {', '.join(given) or 'none'}; "
            "tool_choice 'auto' and 'none' leave the answer free)"
        )
    return constraint.tools if constraint.tools is not None else constraint.schema


@dataclass(frozen=True)
class Decoded:
    """One prompt's constrained generation by :func:`generate_constrained`."""

    tokens: list[int]  # generated ids, EOS included where it came
    text: bytes  # what they spell (EOS excluded)
    forward_passes: int  # model calls, the prompt's included
    jumped_tokens: int  # tokens appended without a forward pass of their own (jump-forward)
    seconds: float


# sampling options, and the value that leaves the scores as they are (generate's "off")
_WARPERS = {
    "temperature": (TemperatureLogitsWarper, 1.0),
    "top_k": (TopKLogitsWarper, 0),
    "top_p": (TopPLogitsWarper, 1.0),
}
_LOOP_OPTIONS = frozenset({"do_sample", "max_new_tokens", "logits_processor", *_WARPERS})


def generate_constrained(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    constraint: TrieAutomaton | CompiledSchema,
    *,
    jump_forward: bool | str = True,
    system: str | None = None,
    **options: Any,
) -> list[Decoded]:
    """Generate each prompt's answer under ``constraint`` in triemask's own decoding loop
    (one prompt at a time, the model's KV cache kept, the prompts' common start read once),
    appending forced text in the forward pass of the model's next token.

    After each token, :meth:`~triemask.Matcher.find_jump_forward_string` gives the text every
    continuation begins with. With ``jump_forward=True`` (exact) its tokens are a draft that
    the model verifies in that one pass, as in speculative decoding: each is kept while it is
    the model's own choice there (greedy), or with its probability (sampling: the rest drawn
    from the other tokens), and the model's token replaces the first it would not have
    written; the cache drops what followed. The output is the one decoding without jumps
    gives (the same tokens when greedy, the same distribution when sampling); only forward
    passes are saved. The draft is the tokenizer's tokenization of the forced text, or the
    model's own spelling of it where the model spelled that text differently before in this
    call (``{`` ``"`` where the tokenizer writes ``{"``). Where only EOS may follow, the answer
    ends without a pass.

    With ``jump_forward="canonical"`` the tokenizer's tokens of the forced text are taken
    without the model's say, but the last (a token straddling the forced part and a free one,
    ``"user"`` forced and ``"users"`` the model's word, stays the model's to choose): fewer
    passes again, as SGLang's jump-forward; outputs stay members (valid JSON) but may differ
    from decoding without jumps, since the model sees the tokenizer's tokens, not its own.

    Parameters
    ----------
    constraint : TrieAutomaton or CompiledSchema
        Compiled for this model's vocabulary (:func:`compiler_for`).
    jump_forward : True, "canonical" or False
        Drafts verified by the model (default), taken as the tokenizer writes them, or none
        (a forward pass per token).
    **options
        ``max_new_tokens`` (default 256), ``do_sample`` (default greedy), ``temperature``,
        ``top_k``, ``top_p``, ``logits_processor`` (run before the constraint). Beam search
        and other ``generate`` options need ``model.generate``: :func:`choose` and
        :func:`generate_json` with ``jump_forward=False``.
    """
    unknown = sorted(set(options) - _LOOP_OPTIONS)
    if unknown:
        raise ArgumentTypeError(
            f"triemask's decoding loop takes {', '.join(sorted(_LOOP_OPTIONS))}; got {', '.join(unknown)} "
            "(use jump_forward=False to decode with model.generate)"
        )
    if not isinstance(jump_forward, bool) and jump_forward != "canonical":
        raise ArgumentTypeError(f"jump_forward must be True, False or 'canonical'; got {jump_forward!r}")
    vocab = compiler_for(model, tokenizer).vocab
    if constraint.vocab_fingerprint != vocab.fingerprint:
        raise ArgumentTypeError("the constraint was compiled for another vocabulary than this model's (compiler_for)")
    sampling = bool(options.get("do_sample", False))
    processors = LogitsProcessorList(list(options.get("logits_processor") or []))
    # (as in generate: the processors, the constraint, then the warpers, which see allowed tokens only)
    warpers = LogitsProcessorList(
        [
            warper(options[name])
            for name, (warper, neutral) in _WARPERS.items()
            if sampling and options.get(name) not in (None, neutral)
        ]
    )
    loop = _Loop(
        model,
        tokenizer,
        vocab,
        frozenset(model_eos_token_ids(model, tokenizer)),
        processors,
        warpers,
        sampling,
        int(options.get("max_new_tokens", 256)),
        jump_forward,
        "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values",
    )
    encoded = [
        list(
            tokenizer(render_prompt(tokenizer, prompt, system), add_special_tokens=_adds_special(tokenizer))[
                "input_ids"
            ]
        )
        for prompt in prompts
    ]
    shared = _SharedStart.read(model, encoded, loop.cache_argument)
    return [loop.decode(ids, shared, constraint) for ids in encoded]


@dataclass(frozen=True)
class _SharedStart:
    """The tokens every prompt of a call begins with, read by the model once, and its cache."""

    length: int
    cache: Any  # None where nothing is shared

    @staticmethod
    def read(model: Any, encoded: list[list[int]], cache_argument: str) -> _SharedStart:
        length = 0
        if len(encoded) > 1:
            # (each prompt keeps a token of its own: the pass that reads it gives the first scores)
            longest = min(len(ids) for ids in encoded) - 1
            while length < longest and all(ids[length] == encoded[0][length] for ids in encoded):
                length += 1
        if length == 0:
            return _SharedStart(0, None)
        with torch.no_grad():
            out = model(input_ids=torch.tensor([encoded[0][:length]], device=model.device), use_cache=True)
        return _SharedStart(length, getattr(out, cache_argument))


@dataclass(frozen=True)
class _Loop:
    """What decoding each prompt of a :func:`generate_constrained` call shares."""

    model: Any
    tokenizer: Any
    vocab: Vocabulary
    eos: frozenset[int]
    processors: Any  # run before the constraint
    warpers: Any  # after it (temperature, top-k, top-p)
    sampling: bool
    budget: int  # max_new_tokens
    jump_forward: bool | str  # True (drafts the model verifies), "canonical" or False
    # the KV cache's argument and output field: "cache" from transformers 5.x, before "past_key_values"
    cache_argument: str
    # the start of a forced text -> the tokens the model spelled it with, learned across prompts
    spellings: dict[bytes, list[int]] = field(default_factory=dict)
    lengths: list[int] = field(default_factory=list)  # the keys' lengths, longest first

    def decode(self, ids: list[int], shared: _SharedStart, constraint: TrieAutomaton | CompiledSchema) -> Decoded:
        started = time.perf_counter()
        model = self.model
        sequence: list[int] = ids[: shared.length]  # what the model has read (the KV cache)
        pending: list[int] = ids[shared.length :]
        past = copy.deepcopy(shared.cache)
        matcher = Matcher(constraint, max_rollback=0)
        generated: list[int] = []
        passes = jumped = 0
        drafting = bool(self.jump_forward)
        cache = self.cache_argument
        with torch.no_grad():
            while len(generated) < self.budget:
                room = self.budget - len(generated) - 1  # (the model's own token comes after the draft)
                forced = matcher.find_jump_forward_string() if drafting else ""
                ending = self._forced_end(matcher) if self.jump_forward and not forced else None
                if ending is not None:  # (the answer is complete and nothing may follow: no pass for its EOS)
                    generated.append(ending)
                    jumped += 1
                    break
                draft = self._draft(forced.encode() if isinstance(forced, str) else forced, room)
                out = model(
                    input_ids=torch.tensor([pending + draft], device=model.device), use_cache=True, **{cache: past}
                )
                passes += 1
                past = getattr(out, cache)
                sequence += pending
                accepted, token = self._verify(out.logits[0, -len(draft) - 1 :, :].float(), draft, sequence, matcher)
                sequence += draft[:accepted]
                generated += draft[:accepted]
                jumped += accepted
                self._learn(forced, draft[:accepted], token)
                generated.append(token)
                pending = [token]
                if _croppable(past):
                    past = _crop(past, len(draft) - accepted)
                elif accepted < len(draft):  # (sliding-window or recurrent layers: read what is kept again)
                    past, pending, sequence, drafting = None, sequence + pending, [], False
                if token in self.eos or not matcher.accept_token(token):
                    break
        text = b"".join(self.vocab.token_bytes(t) or b"" for t in generated if t not in self.eos)
        return Decoded(generated, text, passes, jumped, time.perf_counter() - started)

    def _verify(self, rows: Any, draft: list[int], sequence: list[int], matcher: Any) -> tuple[int, int]:
        """How many of ``draft`` the model takes (each accepted by ``matcher``), and its own
        token after them: ``rows`` are its scores after each draft token, the last after all."""
        trusted = len(draft) - 1 if self.jump_forward == "canonical" else 0  # (taken without the model's say)
        for position, row in enumerate(rows):
            proposed = draft[position] if position < len(draft) else None
            if position < trusted and matcher.accept_token(draft[position]):
                continue
            token = self._choose(row[None, :], sequence + draft[:position], matcher, proposed)
            if token != proposed:
                return position, token
            if not matcher.accept_token(token):
                raise StateError(f"the matcher refused token {token}, which its mask allowed")
        raise AssertionError("unreachable: the last row proposes nothing")

    def _forced_end(self, matcher: Any) -> int | None:
        """The EOS token where it is the only token allowed (the first of them where several are)."""
        allowed = matcher.allowed_token_ids()
        return int(allowed[0]) if 0 < len(allowed) <= len(self.eos) and self.eos.issuperset(allowed.tolist()) else None

    def _draft(self, forced: bytes, room: int) -> list[int]:
        """The tokens proposed for ``forced`` (at most ``room``): the model's own spelling of the
        longest start of it that it has spelled before, again for the rest, then the tokenizer's."""
        if self.jump_forward == "canonical":
            return _forced_tokens(self.tokenizer, self.vocab, forced)[:room]
        tokens: list[int] = []
        while forced and len(tokens) < room:
            known = next((self.spellings[forced[:n]] for n in self.lengths if forced[:n] in self.spellings), None)
            if known is None:
                tokens += _forced_tokens(self.tokenizer, self.vocab, forced)
                break
            tokens += known
            forced = forced[len(self._spelled(known)) :]
        return tokens[:room]

    def _learn(self, forced: str | bytes, accepted: list[int], token: int) -> None:
        """Remember how the model spelled the start of ``forced`` when it chose ``token`` after
        ``accepted`` inside the forced text (a token reaching past it is a free choice)."""
        spelling = [*accepted, token]
        text = self._spelled(spelling)
        if token not in self.eos and (forced.encode() if isinstance(forced, str) else forced).startswith(text):
            if text not in self.spellings:
                self.lengths[:] = sorted({*self.lengths, len(text)}, reverse=True)
            self.spellings[text] = spelling

    def _spelled(self, tokens: list[int]) -> bytes:
        return b"".join(self.vocab.token_bytes(t) or b"" for t in tokens)

    def _choose(self, scores: Any, sequence: list[int], matcher: Any, proposed: int | None) -> int:
        """The next token: the processors, the constraint, the warpers, then greedy or a sample.
        A ``proposed`` token is kept with its probability, else one is drawn from the others
        (speculative sampling with a one-token draft: the model's distribution exactly)."""
        so_far = torch.tensor([sequence], device=scores.device)
        if self.processors:
            scores = self.processors(so_far, scores)
        keep = torch.zeros(scores.shape[-1], dtype=torch.bool)
        keep[torch.from_numpy(matcher.allowed_token_ids().astype(np.int64))] = True
        scores = scores.masked_fill(~keep.to(scores.device), float("-inf"))
        if self.warpers:
            scores = self.warpers(so_far, scores)
        if not self.sampling:
            return int(scores.argmax(dim=-1)[0])
        probabilities = torch.softmax(scores, dim=-1)
        if proposed is not None:
            if float(torch.rand(())) < float(probabilities[0, proposed]):
                return proposed
            probabilities[0, proposed] = 0.0
        return int(torch.multinomial(probabilities, 1)[0, 0])


def _croppable(past: Any) -> bool:
    """Whether the KV cache can drop a refused draft's positions (sliding-window and recurrent
    layers may not: the loop then reads the kept tokens again and drafts no more)."""
    return isinstance(past, tuple) or bool(getattr(past, "is_croppable", hasattr(past, "crop")))


def _crop(past: Any, count: int) -> Any:
    """``past`` without its last ``count`` positions."""
    if count == 0:
        return past
    if isinstance(past, tuple):  # the legacy layout: per layer (key, value), positions on axis -2
        return tuple(tuple(t[..., :-count, :] for t in layer) for layer in past)
    past.crop(-count)  # (a negative count removes that many positions, in transformers 4.x and 5.x alike)
    return past


def _forced_tokens(tokenizer: Any, vocab: Vocabulary, forced: str | bytes) -> list[int]:
    """``forced``'s tokens by ``tokenizer``, or none where they do not spell it exactly."""
    if not forced:
        return []
    text = forced if isinstance(forced, str) else forced.decode("utf-8", "replace")
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    spelled = b"".join(vocab.token_bytes(t) or b"\x00" for t in ids if 0 <= t < len(vocab))
    wanted = forced.encode() if isinstance(forced, str) else forced
    return ids if spelled == wanted else []


def _adds_special(tokenizer: Any) -> bool:
    """Whether encoding a rendered prompt adds the tokenizer's special tokens: not where its
    chat template (render_prompt) already wrote them."""
    return getattr(tokenizer, "chat_template", None) is None


def _encode_left_padded(tokenizer: Any, batch: list[str]) -> Any:
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        return tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=_adds_special(tokenizer))
    finally:
        tokenizer.padding_side = side


def compiler_for(model: Any, tokenizer: Any) -> Compiler:
    """The :class:`~triemask.Compiler` for ``model``'s vocabulary (logits width, EOS
    tokens of its generation config), built once per vocabulary and reused."""
    width, eos = _logits_width(model), model_eos_token_ids(model, tokenizer)
    # the same tokenizer object again (a decoding loop per call): no new table of its tokens
    # (0.3 s for a 49K vocabulary); its size in the key catches tokens added since
    seen = (width, eos, len(tokenizer))
    known = None
    with _COMPILERS_LOCK, suppress(TypeError):  # (a tokenizer that takes no weak reference or hash)
        known = _BY_TOKENIZER.get(tokenizer)
    if known is not None and known[0] == seen:
        return known[1]
    vocab = Vocabulary.from_huggingface(tokenizer, vocab_size=width, eos_token_ids=eos)
    with _COMPILERS_LOCK:
        compiler = _COMPILERS.get(vocab.fingerprint)
    if compiler is None:
        built = Compiler(vocab)  # outside the lock: building an index takes a while
        with _COMPILERS_LOCK:
            compiler = _COMPILERS.setdefault(vocab.fingerprint, built)
    with _COMPILERS_LOCK, suppress(TypeError):  # (likewise: not kept)
        _BY_TOKENIZER[tokenizer] = (seen, compiler)
    return compiler


def render_prompt(tokenizer: Any, prompt: str, system: str | None) -> str:
    """``prompt`` (and a system message) through the tokenizer's chat template, ready for
    generation; the plain text when the tokenizer has no template."""
    if getattr(tokenizer, "chat_template", None) is None:
        return prompt if system is None else f"{system}\n\n{prompt}"
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": prompt}
    ]
    return str(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))


def model_eos_token_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    """The model's end-of-turn tokens (generation config), else the tokenizer's EOS."""
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None) if config is not None else None
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("neither the model's generation config nor the tokenizer names an EOS token")
    return tuple(eos) if isinstance(eos, list | tuple) else (int(eos),)


def _logits_width(model: Any) -> int:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)


def spelled_value(automaton: TrieAutomaton, tokens: list[int]) -> str | None:
    """The value a generated row spells, or None when it did not complete one."""
    state = automaton.initial_state
    for token in tokens:
        if automaton.is_final(state):
            break  # what follows EOS is padding
        state = automaton.next_state(state, token)
        if state == DEAD:
            return None
    if not automaton.is_final(state):
        return None
    # a DAG's state does not name its text: read it from the tokens
    if isinstance(automaton, DagAutomaton | LazyDagAutomaton):
        return automaton.spell(tokens)
    value = automaton.value_of(state)
    return value if value is None else str(value)
