"""Masks built on a torch device from a compiled automaton uploaded once.

>>> on_gpu = DeviceAutomaton(automaton, "cuda")  # doctest: +SKIP
>>> logits = on_gpu.mask_logits(logits, states)  # states: (batch,) int64 on the device  # doctest: +SKIP

For a batch of states, each state's allowed tokens are gathered from the automaton's
CSR arrays (padded to the largest allowed set, so shapes are static) and scattered into
a ``(batch, vocab)`` boolean mask on the device: no CPU bitmask, no host synchronisation,
work proportional to ``batch x largest allowed set``. Advancing the states is the same
gather followed by a comparison with the sampled tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._automaton import DEAD, TrieAutomaton

try:
    import torch
except ImportError as error:  # pragma: no cover - exercised only without torch
    raise ImportError("triemask.integrations.torch needs torch: pip install torch==2.13.0") from error

__all__ = ["DeviceAutomaton"]


class DeviceAutomaton:
    """A :class:`~triemask.TrieAutomaton`'s transition arrays on a torch device.

    Parameters
    ----------
    automaton : TrieAutomaton
        The compiled set.
    device : torch.device or str, optional
        Where the arrays live (default CPU). They are uploaded once, here.

    Notes
    -----
    States are the automaton's integer states, as a 1-D ``int64`` tensor on the same
    device. A final or DEAD state allows nothing; :meth:`allowed_mask` lets such rows
    emit EOS (``ended_allow_eos``) so a finished or derailed row can always stop.
    """

    def __init__(self, automaton: TrieAutomaton, device: Any = None) -> None:
        if not isinstance(automaton, TrieAutomaton):
            raise TypeError(f"DeviceAutomaton needs a TrieAutomaton, got {type(automaton).__qualname__}")
        self.automaton = automaton
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        offsets = automaton._edge_offsets  # num_nodes + 2 entries: the last pair is an empty sentinel
        self.max_allowed = int(np.diff(offsets).max(initial=0))
        # one padding edge at the end: lanes past a state's allowed tokens point at it
        self._padding = len(automaton._edge_tokens)
        tokens = np.append(automaton._edge_tokens.astype(np.int64), automaton.vocab_size)
        dests = np.append(automaton._edge_dests.astype(np.int64), DEAD)
        self._offsets = torch.from_numpy(offsets.astype(np.int64)).to(self.device)
        self._tokens = torch.from_numpy(tokens).to(self.device)
        self._dests = torch.from_numpy(dests).to(self.device)
        # at least as many lanes as EOS ids, so an ended row can allow all of them
        self._lanes = torch.arange(max(self.max_allowed, len(automaton.eos_token_ids), 1), device=self.device)
        self._eos = torch.tensor(automaton.eos_token_ids, dtype=torch.int64, device=self.device)

    @property
    def memory_bytes(self) -> int:
        """Device bytes held by the uploaded arrays."""
        return sum(t.numel() * t.element_size() for t in (self._offsets, self._tokens, self._dests, self._lanes))

    def _edges(self, states: Any) -> tuple[Any, Any]:
        """Each state's allowed edges as a ``(batch, max_allowed)`` index, and the ended rows."""
        if not isinstance(states, torch.Tensor) or states.dim() != 1 or states.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"states must be a 1-D int64 tensor, got {_describe(states)}")
        if states.device != self.device:
            raise ValueError(f"states are on {states.device} but the automaton is on {self.device}")
        live = (states >= 0) & (states < self.automaton.num_nodes)
        nodes = torch.where(live, states.long(), self.automaton.num_nodes)  # the empty sentinel node
        first, last = self._offsets[nodes], self._offsets[nodes + 1]
        index = first[:, None] + self._lanes[None, :]
        index = torch.where(index < last[:, None], index, self._padding)
        return index, ~live

    def allowed_mask(self, states: Any, vocab_size: int | None = None, *, ended_allow_eos: bool = True) -> Any:
        """A ``(batch, vocab_size)`` boolean tensor: token ``j`` allowed in row ``i``.

        ``vocab_size`` is the logits width (default the automaton's; it may be larger,
        the extra columns are never allowed).
        """
        width = self.automaton.vocab_size if vocab_size is None else int(vocab_size)
        if width < self.automaton.vocab_size:
            raise ValueError(f"vocab_size={width} is smaller than the automaton's {self.automaton.vocab_size}")
        index, ended = self._edges(states)
        tokens = self._tokens[index]  # padding lanes hold column vocab_size, dropped below
        tokens = torch.where(tokens == self.automaton.vocab_size, width, tokens)
        mask = torch.zeros((len(states), width + 1), dtype=torch.bool, device=self.device)
        mask.scatter_(1, tokens, True)
        if ended_allow_eos and len(self._eos):
            mask[:, self._eos] |= ended[:, None]
        return mask[:, :width]

    def mask_logits(self, logits: Any, states: Any, rows: Any = None, *, ended_allow_eos: bool = True) -> Any:
        """Set the logits of disallowed tokens to ``-inf``, in place, and return them.

        ``rows`` (a 1-D int64 tensor, distinct) names the rows of ``logits`` that
        ``states`` belong to; by default row ``i`` has ``states[i]``. Other rows are not
        touched. The allowed logits are gathered, the rows filled with ``-inf`` and the
        gathered values scattered back: no vocabulary-wide mask and no host synchronisation.
        """
        count = len(states)
        if logits.dim() != 2 or (rows is None and logits.shape[0] != count):
            raise ValueError(f"logits must be (batch={count}, vocab), got shape {tuple(logits.shape)}")
        if logits.shape[1] < self.automaton.vocab_size:
            raise ValueError(
                f"logits have {logits.shape[1]} columns, fewer than the automaton's {self.automaton.vocab_size}"
            )
        if rows is None:
            rows = torch.arange(count, device=logits.device)
        elif not isinstance(rows, torch.Tensor) or rows.shape != (count,):
            raise ValueError(f"rows must be a tensor of shape ({count},), got {_describe(rows)}")
        index, ended = self._edges(states)
        tokens = self._tokens[index]
        # padding lanes repeat the row's first lane, so writing them back changes nothing
        padded = index == self._padding
        tokens = torch.where(padded, tokens[:, :1], tokens)
        empty = padded[:, 0]  # nothing allowed: final, DEAD, or a value's end without EOS
        if ended_allow_eos and len(self._eos):  # finished or derailed rows may still stop
            eos_lanes = self._eos[torch.clamp(self._lanes, max=len(self._eos) - 1)]
            tokens = torch.where(ended[:, None], eos_lanes[None, :], tokens)
            empty = empty & ~ended
        tokens = torch.where(empty[:, None], 0, tokens).to(logits.device)
        rows = rows.to(logits.device)
        row_index = rows[:, None].expand_as(tokens)
        kept = logits[row_index, tokens].masked_fill(empty[:, None].to(logits.device), float("-inf"))
        logits.index_fill_(0, rows, float("-inf"))
        logits[row_index, tokens] = kept
        return logits

    def next_states(self, states: Any, token_ids: Any) -> Any:
        """The state of each row after its token (DEAD where not allowed), on the device."""
        index, _ = self._edges(states)
        if not isinstance(token_ids, torch.Tensor) or token_ids.shape != states.shape:
            raise ValueError(f"token_ids must be a tensor of shape {tuple(states.shape)}, got {_describe(token_ids)}")
        match = self._tokens[index] == token_ids.to(self.device, torch.int64)[:, None]
        found = match.any(dim=1)
        # allowed tokens are distinct within a row: at most one lane matches
        destination = (self._dests[index] * match).sum(dim=1)
        return torch.where(found, destination, DEAD)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor of dtype {value.dtype} and shape {tuple(value.shape)} on {value.device}"
    return type(value).__qualname__
