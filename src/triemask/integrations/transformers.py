"""Hugging Face transformers: keep every generated sequence inside a set.

>>> processor = TrieLogitsProcessor(automaton)  # doctest: +SKIP
>>> model.generate(input_ids, logits_processor=[processor], eos_token_id=automaton.eos_token_ids)  # doctest: +SKIP

The processor is stateless in the sense that matters for ``generate``: each row's
state is derived from that row's own generated tokens at every call, so greedy search,
sampling and beam search (which reorders rows between calls) are all constrained
correctly. All rows are masked with one ``fill_bitmask`` call and one tensor operation.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from .._automaton import DEAD, TrieAutomaton
from .._bitmask import allocate_token_bitmask

try:
    import torch
    from transformers import LogitsProcessor
except ImportError as error:  # pragma: no cover - exercised only without the extras
    raise ImportError(
        "triemask.integrations.transformers needs torch and transformers: "
        "pip install torch==2.13.0 'triemask[transformers]'"
    ) from error

__all__ = ["TrieLogitsProcessor"]


class TrieLogitsProcessor(LogitsProcessor):  # type: ignore[misc,unused-ignore]  # Any without transformers
    """A ``LogitsProcessor`` that allows, in every row, only tokens that keep the
    row's generated text a prefix of a value of ``automaton`` (and EOS once a value
    is complete).

    Parameters
    ----------
    automaton : TrieAutomaton
        The compiled set; its ``vocab_size`` must not exceed the model's logits width.
    prompt_length : int, optional
        Where generation starts in ``input_ids`` (the padded prompt length). By
        default the length seen at the first call; a call whose length is not one
        more than the previous call's starts a new generation, so one processor can
        serve successive ``generate`` calls.

    Notes
    -----
    A row whose value is complete and that has emitted EOS (or a row a token outside
    the set was forced into) allows only EOS, so a finished row never has all of its
    logits at ``-inf``.
    """

    def __init__(self, automaton: TrieAutomaton, *, prompt_length: int | None = None) -> None:
        if not isinstance(automaton, TrieAutomaton):
            raise TypeError(f"TrieLogitsProcessor needs a TrieAutomaton, got {type(automaton).__qualname__}")
        if not automaton.eos_token_ids:
            raise ValueError("the automaton's vocabulary has no EOS token ids: generation could never stop")
        self.automaton = automaton
        self._fixed_start = prompt_length
        self._start = prompt_length if prompt_length is not None else -1
        self._last_length = -1
        self._generated: npt.NDArray[np.int64] | None = None  # previous call's generated tokens
        self._states: npt.NDArray[np.int64] | None = None  # and the states they lead to
        self._bitmask = allocate_token_bitmask(0, automaton.vocab_size)
        self._shifts = torch.arange(32, dtype=torch.int32)
        self._eos = np.asarray(automaton.eos_token_ids, dtype=np.int64)

    def states(self, input_ids: Any) -> npt.NDArray[np.int64]:
        """The automaton state of every row of ``input_ids`` (batch, sequence length)."""
        length = int(input_ids.shape[1])
        if self._fixed_start is None and length != self._last_length + 1:
            self._start, self._generated, self._states = length, None, None  # a new generation
        self._last_length = length
        if not 0 <= self._start <= length:
            raise ValueError(f"prompt_length={self._start} is outside input_ids of length {length}")
        generated = input_ids[:, self._start :].detach().cpu().numpy().astype(np.int64, copy=False)
        previous, states = self._generated, self._states
        if (
            previous is not None
            and states is not None
            and previous.shape == (generated.shape[0], generated.shape[1] - 1)
            and np.array_equal(generated[:, :-1], previous)
        ):
            states = self._advance(states, generated[:, -1])  # the rows kept their order: one step
        else:  # first call, or rows reordered (beam search): walk every row from the start
            states = np.full(generated.shape[0], self.automaton.initial_state, dtype=np.int64)
            for column in generated.T:
                states = self._advance(states, column)
        self._generated, self._states = generated, states
        return states

    def _advance(self, states: npt.NDArray[np.int64], tokens: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """One token for every row; a finished (final) or dead row stays as it is."""
        stays = (states == DEAD) | (states >= self.automaton.num_nodes)
        following = self.automaton.next_states(np.where(stays, DEAD, states), tokens).astype(np.int64)
        return np.where(stays, states, following)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        batch, width = int(scores.shape[0]), int(scores.shape[-1])
        if self.automaton.vocab_size > width:
            raise ValueError(
                f"the automaton has vocab_size={self.automaton.vocab_size} but the logits have only {width} "
                "columns: build the Vocabulary with the model's vocab_size"
            )
        states = self.states(input_ids)
        if len(states) != batch:
            raise ValueError(f"input_ids has {len(states)} rows but scores has {batch}")
        if self._bitmask.shape[0] < batch:
            self._bitmask = allocate_token_bitmask(batch, self.automaton.vocab_size)
        bitmask = self._bitmask[:batch]
        self.automaton.fill_bitmask(bitmask, states)
        ended = np.flatnonzero((states == DEAD) | (states >= self.automaton.num_nodes))
        if ended.size:  # finished rows: EOS only
            bitmask[ended] = 0
            for eos in self._eos.tolist():
                bit = 1 << (eos & 31)
                bitmask[ended, eos >> 5] |= bit - (1 << 32) if bit >= 1 << 31 else bit  # as a signed int32
        words = torch.from_numpy(bitmask)
        allowed = ((words.unsqueeze(-1) >> self._shifts) & 1).view(batch, -1)[:, :width].bool()
        if allowed.shape[1] < width:  # model columns beyond the automaton's vocabulary: never allowed
            allowed = torch.nn.functional.pad(allowed, (0, width - allowed.shape[1]))
        return scores.masked_fill(~allowed.to(scores.device), float("-inf"))
