"""Greedy generation, one prompt at a time, for prompts that share a long prefix.

The demo and ``triemask eval`` ask many questions with the same instructions and
option list in front. On a CPU the prompt's forward pass dominates, so the key/value
cache of the shared part is computed once and each question pays only for its own
tokens. Every prompt is still tokenized whole, so its tokens are exactly the ones an
uncached run would see; one whose tokens do not start with the cached ones runs
without the cache.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Any

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from ..automata import TrieAutomaton
from ..integrations.transformers import TrieLogitsProcessor, compiler_for, model_eos_token_ids


@dataclass
class Generation:
    """What one prompt produced."""

    tokens: list[int]  # generated tokens, with the EOS that ended them
    text: str  # their decoded text
    mask_steps: int  # calls of the set constraint (0 when unconstrained)
    mask_seconds: float  # time in those calls


class SharedPrefixGenerator:
    """Generate for prompts that start with ``prefix`` (a rendered prompt's text).

    Parameters
    ----------
    model, tokenizer
        A transformers causal LM and its tokenizer.
    prefix : str
        Text every prompt passed to :meth:`generate` is expected to start with; its
        cache is computed here once. A prompt that shares less simply reuses less.
    """

    # the tokenization of the prefix's text alone may end differently from the same text
    # inside a longer prompt (a word cut in two), so its last few tokens are not cached
    _MARGIN = 2

    def __init__(self, model: Any, tokenizer: Any, prefix: str) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.eos = model_eos_token_ids(model, tokenizer)
        ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
        self._prefix_ids: list[int] = ids[: max(0, len(ids) - self._MARGIN)]
        # transformers 5 renamed generate's past_key_values to cache
        self._cache_argument = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self._cache = None
        if self._prefix_ids:
            with torch.no_grad():
                output = model(input_ids=torch.tensor([self._prefix_ids], device=model.device), use_cache=True)
            self._cache = output[1]  # the key/value cache, whatever its attribute is called

    def generate(
        self, prompt: str, *, automaton: TrieAutomaton | None, max_new_tokens: int, first_line: bool = False
    ) -> Generation:
        """Greedy generation for ``prompt``, constrained to ``automaton`` when given;
        with ``first_line``, it stops at the first line break that follows some text."""
        ids: list[int] = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        options: dict[str, Any] = {}
        reuse = len(self._prefix_ids)
        if self._cache is not None and len(ids) > reuse and ids[:reuse] == self._prefix_ids:
            options[self._cache_argument] = copy.deepcopy(self._cache)
        processor = None
        if automaton is not None:
            processor = TrieLogitsProcessor(automaton, prompt_length=len(ids))
            options["logits_processor"] = [processor]
        if first_line:
            options["stopping_criteria"] = StoppingCriteriaList([_FirstLine(self._line_breaks(), len(ids))])
        input_ids = torch.tensor([ids], device=self.model.device)
        with torch.no_grad():
            output = self.model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                eos_token_id=list(self.eos),
                pad_token_id=self.eos[0],
                **options,
            )
        tokens = output[0, len(ids) :].tolist()
        return Generation(
            tokens=tokens,
            text=str(self.tokenizer.decode(tokens, skip_special_tokens=True)),
            mask_steps=processor.steps if processor is not None else 0,
            mask_seconds=processor.mask_seconds if processor is not None else 0.0,
        )

    def _line_breaks(self) -> tuple[frozenset[int], frozenset[int]]:
        """Tokens that contain a line break, and tokens that are only white space."""
        vocab = compiler_for(self.model, self.tokenizer).vocab
        if vocab.fingerprint not in _LINE_BREAKS:
            spelled = [(token, vocab.token_bytes(token)) for token in range(vocab.vocab_size)]
            _LINE_BREAKS[vocab.fingerprint] = (
                frozenset(token for token, text in spelled if text is not None and b"\n" in text),
                frozenset(token for token, text in spelled if text is not None and not text.strip()),
            )
        return _LINE_BREAKS[vocab.fingerprint]


_LINE_BREAKS: dict[str, tuple[frozenset[int], frozenset[int]]] = {}  # per vocabulary fingerprint


class _FirstLine(StoppingCriteria):  # type: ignore[misc,unused-ignore]  # Any without transformers
    """Stop at a line break that follows some text (an unconstrained answer's first line)."""

    def __init__(self, breaks: tuple[frozenset[int], frozenset[int]], start: int) -> None:
        self.breaks, self.blank = breaks
        self.start = start

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        generated = input_ids[0, self.start :].tolist()
        done = bool(generated) and generated[-1] in self.breaks and any(t not in self.blank for t in generated[:-1])
        return torch.tensor([done], device=input_ids.device)
