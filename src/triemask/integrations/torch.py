"""Masks built on a torch device from a compiled automaton uploaded once.

>>> on_gpu = DeviceAutomaton(automaton, "cuda")  # doctest: +SKIP
>>> logits = on_gpu.mask_logits(logits, states)  # host ints or a (batch,) int64 tensor  # doctest: +SKIP

For a batch of states, the allowed ``(row, token)`` pairs are taken from the
automaton's CSR arrays (no padding: the work follows the allowed tokens of the rows'
actual states, whatever the widest node of the set), the allowed logits gathered,
the rows filled with ``-inf`` and the gathered logits scattered back. A state that
allows more than half of the vocabulary (the root of a set of 150,000 single-token
values, say) is masked the other way round: its row is left as it is and only its
disallowed tokens, precomputed per such node, are set to ``-inf``. A row therefore
costs ``min(allowed, vocab_size - allowed)`` writes. States held on the host (vLLM's
V1 runner, SGLang) give the pairs with NumPy and upload them; states held on the
device (Model Runner V2) give them on the device, at the cost of one read of three
counts. Advancing device states is a binary search over the edges' ``(node, token)`` keys.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ..automata import DEAD, LazyTrieAutomaton, TrieAutomaton, UpdatedTrieAutomaton
from ..base import ArgumentTypeError, BitmaskError, StateError

try:
    import torch
except ImportError as error:  # pragma: no cover - exercised only without torch
    raise ImportError("triemask.integrations.torch needs torch: pip install torch==2.13.0") from error

__all__ = ["DeviceAutomaton", "HostPlannedAutomaton", "device_automaton"]


class _Plan(NamedTuple):
    """How to mask a batch of rows (indices are positions in the batch of states)."""

    narrow: Any  # rows filled with -inf, then their allowed pairs written back
    allowed_rows: Any  # the allowed (row, token) pairs of the narrow rows (EOS for ended rows)
    allowed_tokens: Any
    wide: Any  # rows left as they are but for their disallowed tokens
    banned_rows: Any  # the disallowed (row, token) pairs of the wide rows
    banned_tokens: Any


def _csr_pairs(
    offsets: npt.NDArray[np.int64], tokens: npt.NDArray[Any], nodes: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Every (position in ``nodes``, token) pair of a CSR table, in one pass."""
    first = offsets[nodes]
    counts = offsets[nodes + 1] - first
    ends = np.cumsum(counts)
    total = int(ends[-1]) if len(nodes) else 0
    index = np.arange(total) + np.repeat(first + counts - ends, counts)
    return np.repeat(np.arange(len(nodes), dtype=np.int64), counts), tokens[index].astype(np.int64)


def _csr_pairs_on_device(offsets: Any, tokens: Any, nodes: Any, total: int) -> tuple[Any, Any]:
    """:func:`_csr_pairs` on the device, with the number of pairs known."""
    first = offsets[nodes]
    counts = offsets[nodes + 1] - first
    rows = torch.repeat_interleave(torch.arange(len(nodes), device=nodes.device), counts, output_size=total)
    starts = torch.repeat_interleave(first - (torch.cumsum(counts, 0) - counts), counts, output_size=total)
    return rows, tokens[torch.arange(total, device=nodes.device) + starts]


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
        if isinstance(automaton, LazyTrieAutomaton):
            raise ArgumentTypeError(
                "DeviceAutomaton uploads every edge, and a lazy automaton stores none: "
                "compile the set with layout='trie' for the device"
            )
        self.automaton = automaton
        self.device = _torch_device(device)
        edge_offsets, edge_tokens, edge_dests = automaton.edge_arrays()
        offsets = edge_offsets.astype(np.int64)  # num_nodes + 2 entries: the last, an empty sentinel
        tokens = edge_tokens.astype(np.int64)
        # (node, token) of every edge as one sorted key: CSR order is node, then token ascending
        counts = np.diff(offsets)
        sources = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        self._stride = automaton.vocab_size + 1
        self._offsets = torch.from_numpy(offsets).to(self.device)
        self._tokens = torch.from_numpy(tokens).to(self.device)
        self._dests = torch.from_numpy(edge_dests.astype(np.int64)).to(self.device)
        self._keys = torch.from_numpy(sources * self._stride + tokens).to(self.device)
        self._eos_host = np.asarray(automaton.eos_token_ids, dtype=np.int64)
        self._eos = torch.from_numpy(self._eos_host).to(self.device)
        # nodes allowing more than half of the vocabulary: their disallowed tokens, as a CSR
        # (fewer than their allowed ones, so at most one entry per edge in all)
        self._wide_host = counts > automaton.vocab_size // 2
        banned = [
            np.setdiff1d(np.arange(automaton.vocab_size), tokens[offsets[node] : offsets[node + 1]], assume_unique=True)
            for node in np.flatnonzero(self._wide_host)
        ]
        banned_counts = np.zeros(len(counts), dtype=np.int64)
        banned_counts[self._wide_host] = [len(b) for b in banned]
        self._banned_offsets_host = np.concatenate(([0], np.cumsum(banned_counts)))
        self._banned_host = np.concatenate(banned) if banned else np.zeros(0, dtype=np.int64)
        self._wide = torch.from_numpy(self._wide_host).to(self.device)
        self._banned_offsets = torch.from_numpy(self._banned_offsets_host).to(self.device)
        self._banned = torch.from_numpy(self._banned_host).to(self.device)

    @property
    def memory_bytes(self) -> int:
        """Device bytes held by the uploaded arrays."""
        arrays = (self._offsets, self._tokens, self._dests, self._keys, self._wide, self._banned_offsets, self._banned)
        return sum(t.numel() * t.element_size() for t in arrays)

    # ------------------------------------------------------------------ plans

    def _host_plan(self, states: Any, ended_allow_eos: bool) -> _Plan:
        array = np.asarray(states)
        if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
            raise StateError(f"states must be a 1-D sequence of integers, got {_describe(array)}")
        num_nodes, num_states = self.automaton.num_nodes, self.automaton.num_states
        if array.size and (int(array.min()) < DEAD or int(array.max()) >= num_states):
            bad = array[(array < DEAD) | (array >= num_states)][0]
            raise StateError(f"state {int(bad)} is not a state of this automaton (DEAD or 0 <= state < {num_states})")
        array = array.astype(np.int64, copy=False)
        nodes = np.where((array >= 0) & (array < num_nodes), array, num_nodes)  # final, DEAD: the empty sentinel
        wide_row = self._wide_host[nodes]
        narrow, wide = np.flatnonzero(~wide_row), np.flatnonzero(wide_row)
        rows, tokens = self.automaton.allowed_token_pairs(array[narrow])
        rows = narrow[rows]
        if ended_allow_eos and len(self._eos_host):
            ended = np.flatnonzero(nodes == num_nodes)
            rows = np.concatenate([rows, np.repeat(ended, len(self._eos_host))])
            tokens = np.concatenate([tokens.astype(np.int64), np.tile(self._eos_host, len(ended))])
        banned_rows, banned_tokens = _csr_pairs(self._banned_offsets_host, self._banned_host, nodes[wide])
        upload = self._upload
        return _Plan(
            upload(narrow), upload(rows), upload(tokens), upload(wide), upload(wide[banned_rows]), upload(banned_tokens)
        )

    def _device_plan(self, states: Any, ended_allow_eos: bool) -> _Plan:
        nodes, live = self._nodes(states)
        wide_row = self._wide[nodes]
        allowed = torch.where(wide_row, 0, self._offsets[nodes + 1] - self._offsets[nodes])
        banned = self._banned_offsets[nodes + 1] - self._banned_offsets[nodes]
        total, banned_total, num_wide = torch.stack([allowed.sum(), banned.sum(), wide_row.sum()]).tolist()
        order = torch.argsort(wide_row.to(torch.int8), stable=True)  # narrow rows first: no second read
        narrow, wide = order[: len(states) - num_wide], order[len(states) - num_wide :]
        rows, tokens = _csr_pairs_on_device(self._offsets, self._tokens, nodes[narrow], total)
        rows = narrow[rows]
        if ended_allow_eos and len(self._eos):
            keep = ~live.repeat_interleave(len(self._eos))
            rows = torch.cat(
                [rows, torch.arange(len(states), device=self.device).repeat_interleave(len(self._eos))[keep]]
            )
            tokens = torch.cat([tokens, self._eos.repeat(len(states))[keep]])
        banned_rows, banned_tokens = _csr_pairs_on_device(self._banned_offsets, self._banned, nodes[wide], banned_total)
        return _Plan(narrow, rows, tokens, wide, wide[banned_rows], banned_tokens)

    def _plan(self, states: Any, ended_allow_eos: bool) -> _Plan:
        if isinstance(states, torch.Tensor):
            return self._device_plan(states, ended_allow_eos)
        return self._host_plan(states, ended_allow_eos)

    def _upload(self, array: Any) -> Any:
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64)).to(self.device, non_blocking=True)

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
        width = _mask_width(vocab_size, self.automaton.vocab_size)
        plan = self._plan(states, ended_allow_eos)
        mask = torch.zeros((len(states), width), dtype=torch.bool, device=self.device)
        mask[plan.allowed_rows, plan.allowed_tokens] = True
        mask[plan.wide, : self.automaton.vocab_size] = True
        mask[plan.banned_rows, plan.banned_tokens] = False
        return mask

    def mask_logits(self, logits: Any, states: Any, rows: Any = None, *, ended_allow_eos: bool = True) -> Any:
        """Set the logits of disallowed tokens to ``-inf``, in place, and return them.

        ``states`` is a host sequence / array of ints or a 1-D int64 tensor on this
        automaton's device. ``rows`` (a 1-D int64 tensor, distinct) names the rows of
        ``logits`` that ``states`` belong to; by default row ``i`` has ``states[i]``.
        Other rows are not touched. The work follows the rows' states: a row costs
        ``min(allowed, vocab_size - allowed)`` writes, plus a fill of the row when
        fewer than half of the tokens are allowed.
        """
        rows = _logits_rows(logits, len(states), rows, self.automaton.vocab_size)
        plan = self._plan(states, ended_allow_eos)
        rows = rows.to(logits.device)
        where = (rows[plan.allowed_rows.to(logits.device)], plan.allowed_tokens.to(logits.device))
        kept = logits[where]
        logits.index_fill_(0, rows[plan.narrow.to(logits.device)], float("-inf"))  # nothing allowed stays -inf
        logits[where] = kept
        logits[rows[plan.banned_rows.to(logits.device)], plan.banned_tokens.to(logits.device)] = float("-inf")
        if logits.shape[1] > self.automaton.vocab_size:  # padding columns of wide rows
            logits[rows[plan.wide.to(logits.device)], self.automaton.vocab_size :] = float("-inf")
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


class HostPlannedAutomaton:
    """:class:`DeviceAutomaton`'s interface for an automaton without edge arrays to upload (an
    updated set, :meth:`~triemask.TrieAutomaton.with_values`; the lazy layout): a batch's
    allowed ``(row, token)`` pairs come from the automaton's own lookups on the host (its C
    kernel) and are uploaded. Device states are read back to step them: one synchronisation
    a step, where :class:`DeviceAutomaton` has none. A state that allows nothing (final, DEAD)
    allows EOS in :meth:`mask_logits` and :meth:`allowed_mask` (``ended_allow_eos``).
    """

    def __init__(self, automaton: TrieAutomaton, device: Any = None) -> None:
        if not isinstance(automaton, TrieAutomaton):
            raise ArgumentTypeError(f"HostPlannedAutomaton needs a TrieAutomaton, got {type(automaton).__qualname__}")
        self.automaton = automaton
        self.device = _torch_device(device)
        self._eos_host = np.asarray(automaton.eos_token_ids, dtype=np.int64)

    @property
    def memory_bytes(self) -> int:
        """Device bytes held: none (the automaton stays on the host)."""
        return 0

    def _pairs(self, states: Any, ended_allow_eos: bool) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        if isinstance(states, torch.Tensor):
            if states.dim() != 1 or states.dtype not in (torch.int64, torch.int32):
                raise StateError(f"states must be a 1-D int64 tensor, got {_describe(states)}")
            states = states.cpu().numpy()
        array = np.asarray(states)
        if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
            raise StateError(f"states must be a 1-D sequence of integers, got {_describe(array)}")
        pair_rows, pair_tokens = self.automaton.allowed_token_pairs(array.astype(np.int64, copy=False))
        rows, tokens = pair_rows.astype(np.int64, copy=False), pair_tokens.astype(np.int64)
        if ended_allow_eos and len(self._eos_host):
            ended = np.flatnonzero(np.bincount(rows, minlength=len(array)) == 0)  # final or DEAD
            rows = np.concatenate([rows, np.repeat(ended, len(self._eos_host))])
            tokens = np.concatenate([tokens, np.tile(self._eos_host, len(ended))])
        return rows, tokens

    def _upload(self, array: Any, device: Any) -> Any:
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64)).to(device, non_blocking=True)

    def allowed_mask(self, states: Any, vocab_size: int | None = None, *, ended_allow_eos: bool = True) -> Any:
        """A ``(batch, vocab_size)`` boolean tensor: token ``j`` allowed in row ``i`` (see
        :meth:`DeviceAutomaton.allowed_mask`)."""
        width = _mask_width(vocab_size, self.automaton.vocab_size)
        rows, tokens = self._pairs(states, ended_allow_eos)
        mask = torch.zeros((len(states), width), dtype=torch.bool, device=self.device)
        mask[self._upload(rows, self.device), self._upload(tokens, self.device)] = True
        return mask

    def mask_logits(self, logits: Any, states: Any, rows: Any = None, *, ended_allow_eos: bool = True) -> Any:
        """Set the logits of disallowed tokens to ``-inf``, in place, and return them (see
        :meth:`DeviceAutomaton.mask_logits`)."""
        rows = _logits_rows(logits, len(states), rows, self.automaton.vocab_size)
        pair_rows, tokens = self._pairs(states, ended_allow_eos)
        rows = rows.to(logits.device)
        where = (rows[self._upload(pair_rows, logits.device)], self._upload(tokens, logits.device))
        kept = logits[where]
        logits.index_fill_(0, rows, float("-inf"))
        logits[where] = kept
        return logits

    def next_states(self, states: Any, token_ids: Any) -> Any:
        """The state of each row after its token (DEAD where not allowed), on the states' device."""
        if not isinstance(states, torch.Tensor) or states.dim() != 1 or states.dtype not in (torch.int64, torch.int32):
            raise StateError(f"states must be a 1-D int64 tensor, got {_describe(states)}")
        if not isinstance(token_ids, torch.Tensor) or token_ids.shape != states.shape:
            raise StateError(f"token_ids must be a tensor of shape {tuple(states.shape)}, got {_describe(token_ids)}")
        following = self.automaton.next_states(states.cpu().numpy(), token_ids.cpu().numpy().astype(np.int64))
        return torch.from_numpy(following.astype(np.int64)).to(states.device)


def device_automaton(automaton: TrieAutomaton, device: Any = None) -> DeviceAutomaton | HostPlannedAutomaton:
    """The automaton's arrays on ``device`` (:class:`DeviceAutomaton`), or, for one that stores
    no edge arrays (an updated set, the lazy layout), its masks planned on the host
    (:class:`HostPlannedAutomaton`)."""
    if isinstance(automaton, UpdatedTrieAutomaton | LazyTrieAutomaton):
        return HostPlannedAutomaton(automaton, device)
    return DeviceAutomaton(automaton, device)


def _torch_device(device: Any) -> Any:
    try:
        return torch.device(device) if device is not None else torch.device("cpu")
    except (TypeError, RuntimeError) as error:
        raise ArgumentTypeError(f"device {device!r} is not a torch device: {error}") from None


def _mask_width(vocab_size: int | None, automaton_width: int) -> int:
    width = automaton_width if vocab_size is None else int(vocab_size)
    if width < automaton_width:
        raise BitmaskError(f"vocab_size={width} is smaller than the automaton's {automaton_width}")
    return width


def _logits_rows(logits: Any, count: int, rows: Any, automaton_width: int) -> Any:
    """The rows of ``logits`` that ``count`` states belong to (by default ``0 .. count - 1``),
    ``logits`` and ``rows`` checked."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or (rows is None and logits.shape[0] != count):
        raise BitmaskError(f"logits must be a (batch={count}, vocab) tensor, got {_describe(logits)}")
    if logits.shape[1] < automaton_width:
        raise BitmaskError(f"logits have {logits.shape[1]} columns, fewer than the automaton's {automaton_width}")
    if rows is None:
        return torch.arange(count, device=logits.device)
    if not isinstance(rows, torch.Tensor) or rows.shape != (count,):
        raise StateError(f"rows must be a tensor of shape ({count},), got {_describe(rows)}")
    return rows


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor of dtype {value.dtype} and shape {tuple(value.shape)} on {value.device}"
    if isinstance(value, np.ndarray):
        return f"array of dtype {value.dtype} and shape {value.shape}"
    return type(value).__qualname__
