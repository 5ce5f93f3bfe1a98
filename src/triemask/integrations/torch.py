"""Masks built on a torch device from a compiled automaton uploaded once.

>>> on_gpu = DeviceAutomaton(automaton, "cuda")  # doctest: +SKIP
>>> logits = on_gpu.mask_logits(logits, states)  # host ints or a (batch,) int64 tensor  # doctest: +SKIP

For a batch of states, the allowed ``(row, token)`` pairs are taken from the
automaton's CSR arrays (no padding: the work follows the allowed tokens of the rows'
actual states, whatever the widest node of the set), the allowed logits gathered,
the rows filled with ``-inf`` and the gathered logits scattered back: no CPU bitmask
and no vocabulary-wide mask. States held on the host (vLLM's V1 runner, SGLang) give
the pairs with NumPy and upload them; states held on the device (Model Runner V2)
give them on the device, at the cost of one scalar read (the number of pairs).
Advancing device states is a binary search over the edges' ``(node, token)`` keys.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._automaton import DEAD, TrieAutomaton
from .._errors import ArgumentTypeError, BitmaskError, StateError

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
    States are the automaton's integer states: a 1-D ``int64`` tensor on the same
    device, or a host sequence / NumPy array. A final or DEAD state allows nothing;
    :meth:`mask_logits` and :meth:`allowed_mask` let such rows emit EOS
    (``ended_allow_eos``) so a finished or derailed row can always stop.
    """

    def __init__(self, automaton: TrieAutomaton, device: Any = None) -> None:
        if not isinstance(automaton, TrieAutomaton):
            raise ArgumentTypeError(f"DeviceAutomaton needs a TrieAutomaton, got {type(automaton).__qualname__}")
        self.automaton = automaton
        try:
            self.device = torch.device(device) if device is not None else torch.device("cpu")
        except (TypeError, RuntimeError) as error:
            raise ArgumentTypeError(f"device {device!r} is not a torch device: {error}") from None
        offsets = automaton._edge_offsets  # num_nodes + 2 entries: the last pair is an empty sentinel
        tokens = automaton._edge_tokens.astype(np.int64)
        # (node, token) of every edge as one sorted key: CSR order is node, then token ascending
        sources = np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))
        self._stride = automaton.vocab_size + 1
        self._offsets = torch.from_numpy(offsets.astype(np.int64)).to(self.device)
        self._tokens = torch.from_numpy(tokens).to(self.device)
        self._dests = torch.from_numpy(automaton._edge_dests.astype(np.int64)).to(self.device)
        self._keys = torch.from_numpy(sources * self._stride + tokens).to(self.device)
        self._eos_host = np.asarray(automaton.eos_token_ids, dtype=np.int64)
        self._eos = torch.from_numpy(self._eos_host).to(self.device)

    @property
    def memory_bytes(self) -> int:
        """Device bytes held by the uploaded arrays."""
        return sum(t.numel() * t.element_size() for t in (self._offsets, self._tokens, self._dests, self._keys))

    # ------------------------------------------------------------------ pairs

    def _host_pairs(self, states: Any, ended_allow_eos: bool) -> tuple[Any, Any, Any]:
        """(row, token) pairs and the rows allowing nothing, from host states."""
        array = np.asarray(states)
        if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
            raise StateError(f"states must be a 1-D sequence of integers, got {_describe(array)}")
        rows, tokens = self.automaton.allowed_token_pairs(array.astype(np.int64, copy=False))
        live = (array >= 0) & (array < self.automaton.num_nodes)
        empty = live & (np.bincount(rows, minlength=len(array)) == 0)  # a value's end without EOS
        if ended_allow_eos and len(self._eos_host):
            ended = np.flatnonzero(~live)
            rows = np.concatenate([rows, np.repeat(ended, len(self._eos_host))])
            tokens = np.concatenate([tokens.astype(np.int64), np.tile(self._eos_host, len(ended))])
        else:
            empty |= ~live
        return (
            torch.from_numpy(rows).to(self.device, non_blocking=True),
            torch.from_numpy(tokens.astype(np.int64, copy=False)).to(self.device, non_blocking=True),
            torch.from_numpy(empty).to(self.device, non_blocking=True),
        )

    def _device_pairs(self, states: Any, ended_allow_eos: bool) -> tuple[Any, Any, Any]:
        """(row, token) pairs and the rows allowing nothing, from device states."""
        nodes, live = self._nodes(states)
        first = self._offsets[nodes]
        counts = self._offsets[nodes + 1] - first
        total = int(counts.sum())  # the one host read: how many pairs there are
        batch = torch.arange(len(states), device=self.device)
        rows = torch.repeat_interleave(batch, counts, output_size=total)
        starts = torch.repeat_interleave(first - (torch.cumsum(counts, 0) - counts), counts, output_size=total)
        tokens = self._tokens[torch.arange(total, device=self.device) + starts]
        empty = live & (counts == 0)
        if ended_allow_eos and len(self._eos):
            eos_rows = batch.repeat_interleave(len(self._eos))
            keep = ~live.repeat_interleave(len(self._eos))
            rows = torch.cat([rows, eos_rows[keep]])
            tokens = torch.cat([tokens, self._eos.repeat(len(states))[keep]])
        else:
            empty = empty | ~live
        return rows, tokens, empty

    def _pairs(self, states: Any, ended_allow_eos: bool) -> tuple[Any, Any, Any]:
        if isinstance(states, torch.Tensor):
            return self._device_pairs(states, ended_allow_eos)
        return self._host_pairs(states, ended_allow_eos)

    def _nodes(self, states: Any) -> tuple[Any, Any]:
        """Device states as trie nodes (final / DEAD -> the empty sentinel), and which are live."""
        if not isinstance(states, torch.Tensor) or states.dim() != 1 or states.dtype not in (torch.int64, torch.int32):
            raise StateError(f"states must be a 1-D int64 tensor, got {_describe(states)}")
        if states.device != self.device:
            raise StateError(f"states are on {states.device} but the automaton is on {self.device}")
        live = (states >= 0) & (states < self.automaton.num_nodes)
        return torch.where(live, states.long(), self.automaton.num_nodes), live

    # ------------------------------------------------------------------ masks

    def allowed_mask(self, states: Any, vocab_size: int | None = None, *, ended_allow_eos: bool = True) -> Any:
        """A ``(batch, vocab_size)`` boolean tensor: token ``j`` allowed in row ``i``.

        ``vocab_size`` is the logits width (default the automaton's; it may be larger,
        the extra columns are never allowed).
        """
        width = self.automaton.vocab_size if vocab_size is None else int(vocab_size)
        if width < self.automaton.vocab_size:
            raise BitmaskError(f"vocab_size={width} is smaller than the automaton's {self.automaton.vocab_size}")
        rows, tokens, _ = self._pairs(states, ended_allow_eos)
        mask = torch.zeros((len(states), width), dtype=torch.bool, device=self.device)
        mask[rows, tokens] = True
        return mask

    def mask_logits(self, logits: Any, states: Any, rows: Any = None, *, ended_allow_eos: bool = True) -> Any:
        """Set the logits of disallowed tokens to ``-inf``, in place, and return them.

        ``states`` is a host sequence / array of ints or a 1-D int64 tensor on this
        automaton's device. ``rows`` (a 1-D int64 tensor, distinct) names the rows of
        ``logits`` that ``states`` belong to; by default row ``i`` has ``states[i]``.
        Other rows are not touched. The allowed logits are gathered, the rows filled
        with ``-inf`` and the gathered values scattered back: the work follows the
        allowed tokens of the given states.
        """
        count = len(states)
        if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or (rows is None and logits.shape[0] != count):
            raise BitmaskError(f"logits must be a (batch={count}, vocab) tensor, got {_describe(logits)}")
        if logits.shape[1] < self.automaton.vocab_size:
            raise BitmaskError(
                f"logits have {logits.shape[1]} columns, fewer than the automaton's {self.automaton.vocab_size}"
            )
        if rows is None:
            rows = torch.arange(count, device=logits.device)
        elif not isinstance(rows, torch.Tensor) or rows.shape != (count,):
            raise StateError(f"rows must be a tensor of shape ({count},), got {_describe(rows)}")
        pair_rows, tokens, _ = self._pairs(states, ended_allow_eos)
        rows = rows.to(logits.device)
        where = (rows[pair_rows.to(logits.device)], tokens.to(logits.device))
        kept = logits[where]
        logits.index_fill_(0, rows, float("-inf"))  # rows allowing nothing stay -inf
        logits[where] = kept
        return logits

    def next_states(self, states: Any, token_ids: Any) -> Any:
        """The state of each row after its token (DEAD where not allowed), on the device."""
        nodes, live = self._nodes(states)
        if not isinstance(token_ids, torch.Tensor) or token_ids.shape != states.shape:
            raise StateError(f"token_ids must be a tensor of shape {tuple(states.shape)}, got {_describe(token_ids)}")
        if not len(self._keys):
            return torch.full_like(nodes, DEAD)
        tokens = token_ids.to(self.device, torch.int64)
        query = nodes * self._stride + tokens.clamp(0, self._stride - 1)
        position = torch.searchsorted(self._keys, query).clamp(max=len(self._keys) - 1)
        found = live & (self._keys[position] == query) & (tokens >= 0) & (tokens < self._stride - 1)
        return torch.where(found, self._dests[position], DEAD)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor of dtype {value.dtype} and shape {tuple(value.shape)} on {value.device}"
    if isinstance(value, np.ndarray):
        return f"array of dtype {value.dtype} and shape {value.shape}"
    return type(value).__qualname__
