"""Rows of a batch: one per constrained request, caught up with its output and masked."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...base import unpack_bitmask
from ...schemas import SchemaMatcher, allowed_token_bitmask
from .compiled_sets import CompiledSet, CompiledSets
from .requests import PatternRequest, SchemaRequest, requested_pattern, requested_schema, requested_values

logger = logging.getLogger("triemask")

PLACEHOLDER = -1  # vLLM's async scheduling pads output ids with -1 until the real ids arrive


class RowError(Exception):
    """A constrained row cannot go on (its request is ended alone)."""


class Row:
    """One constrained request in a batch: its set, its live output ids and its state."""

    __slots__ = ("compiled", "consumed", "matcher", "output_ids", "state")

    def __init__(self, compiled: CompiledSet, output_ids: Sequence[int]) -> None:
        self.compiled = compiled
        self.output_ids = output_ids  # the engine's live list
        self.matcher = None if compiled.schema is None else SchemaMatcher(compiled.schema, max_rollback=0)
        self.state = 0 if compiled.automaton is None else compiled.automaton.initial_state
        self.consumed = 0

    def catch_up(self) -> None:
        """Advance the state through the output ids not seen yet (usually one)."""
        automaton, ids = self.compiled.automaton, self.output_ids
        if automaton is None:  # a JSON schema: the matcher follows the tokens
            self._catch_up_schema()
            return
        while self.consumed < len(ids):
            token = ids[self.consumed]
            if token == PLACEHOLDER:
                raise RowError(
                    "the request's output token ids hold the placeholder -1: vLLM's async "
                    "scheduling repairs them only for processors passed with --logits-processors "
                    "(or LLM(logits_processors=[...])), not for ones loaded from the entry point alone "
                    "(vLLM issue #52461). Pass the processor explicitly, or use --no-async-scheduling."
                )
            if self.state >= 0 and not automaton.is_final(self.state):
                self.state = automaton.next_state(self.state, int(token))
            self.consumed += 1

    def _catch_up_schema(self) -> None:
        assert self.matcher is not None
        ids = self.output_ids
        while self.consumed < len(ids):
            token = int(ids[self.consumed])
            if token == PLACEHOLDER:
                raise RowError("the request's output token ids hold the placeholder -1 (vLLM issue #52461)")
            if not self.matcher.is_terminated() and not self.matcher.accept_token(token):
                raise RowError(f"token {token} is outside the JSON schema after {self.matcher.text[-80:]!r}")
            self.consumed += 1

    def end(self, sets: CompiledSets) -> None:
        """From now on allow EOS only, so the request stops at its next token."""
        self.compiled = sets.ended()
        self.matcher = None
        self.state = 0
        self.consumed = len(self.output_ids)

    @classmethod
    def ended(cls, sets: CompiledSets, output_ids: Sequence[int]) -> Row:
        """The row of a request that failed: EOS only, from its next token on."""
        row = cls(sets.ended(), output_ids)
        row.end(sets)
        return row


def constrained_row(sets: CompiledSets, extra_args: Any, output_ids: Sequence[int], request: str = "") -> Row | None:
    """The row of a request (None when it asks for no set); never raises.

    A request whose set cannot be compiled gets a row that allows EOS only, and an
    error naming the reason is logged: it ends at once, the rest of the batch goes on.
    """
    try:
        values: Sequence[str] | SchemaRequest | PatternRequest | None = requested_values(extra_args)
        if values is None:
            values = requested_schema(extra_args)
        if values is None:
            values = requested_pattern(extra_args)
        if values is None:
            return None
        return Row(sets.get(values), output_ids)
    except Exception as error:
        logger.error("triemask: request %s ended (only EOS allowed): %s", request or "?", error)
        return Row.ended(sets, output_ids)


def catch_up_rows(sets: CompiledSets, rows: Mapping[Any, Row]) -> None:
    """Advance every row; a row whose output ids are unusable is ended alone."""
    for key, row in rows.items():
        try:
            row.catch_up()
        except Exception as error:  # noqa: PERF203 - any failure ends this row alone
            logger.error("triemask: request %s ended (only EOS allowed): %s", key, error)
            row.end(sets)


def mask_rows(logits: Any, rows: Mapping[int, Row]) -> Any:
    """Mask the logits of every constrained row, in place: one device operation per set,
    whose cost follows the allowed tokens of the rows' states (computed on the host)."""
    import torch

    groups: dict[int, tuple[CompiledSet, list[int], list[int]]] = {}
    schema_rows = {index: row.matcher for index, row in rows.items() if row.matcher is not None}
    if schema_rows:
        mask_schema_rows(logits, schema_rows)
    for index, row in rows.items():
        if row.matcher is not None:
            continue
        group = groups.setdefault(id(row.compiled), (row.compiled, [], []))
        group[1].append(index)
        group[2].append(row.state)
    for compiled, indices, states in groups.values():
        where = torch.tensor(indices, dtype=torch.int64).to(logits.device, non_blocking=True)
        compiled.device_automaton.mask_logits(logits, np.asarray(states, dtype=np.int64), where)
    return logits


def mask_schema_rows(logits: Any, matchers: Mapping[int, SchemaMatcher]) -> Any:
    """Mask the logits rows of JSON-schema requests, in place: the rows' masks are filled on
    the host as one int32 bitmask and applied by xgrammar's kernel (a finished or failing row
    allows EOS only). No ``(rows, vocabulary)`` array is made: at 64 rows of Qwen's 151,936
    logits the boolean masked fill took 48 ms, the bitmask 22 ms."""
    import torch
    import xgrammar  # a schema request was compiled with it

    indices = list(matchers)
    rows = [matchers[index] for index in indices]

    def ended(row: int, error: Exception) -> None:  # a tool's arguments may compile here, and fail
        logger.error("triemask: request in row %s ended (only EOS allowed): %s", indices[row], error)

    width = int(logits.shape[-1])
    compact = allowed_token_bitmask(rows, rows[0].schema.eos_token_ids, width, ended)
    bitmask = np.zeros((int(logits.shape[0]), compact.shape[1]), dtype=np.int32)  # by the logits' rows
    bitmask[indices] = compact
    try:
        xgrammar.apply_token_bitmask_inplace(
            logits, torch.from_numpy(bitmask).to(logits.device, non_blocking=True), vocab_size=width, indices=indices
        )
    except (ValueError, RuntimeError, TypeError) as error:  # a dtype or device its kernels do not take
        logger.debug("triemask: xgrammar's bitmask kernel refused the logits (%s); masking by booleans", error)
        keep = unpack_bitmask(compact, width)
        where = torch.tensor(indices, dtype=torch.int64, device=logits.device)
        logits[where] = logits[where].masked_fill(~torch.from_numpy(keep).to(logits.device), float("-inf"))
    return logits


class BatchRows:
    """vLLM V1 runner bookkeeping: batch index -> :class:`Row`, kept in step with the
    engine's ``BatchUpdate`` (removed, then added, then moved).

    An update is all or nothing: the rows of the added requests are built first (a
    request whose set fails is given an EOS-only row, never an exception), then the
    removals, additions and moves are applied, none of which can fail.
    """

    def __init__(self, sets: CompiledSets) -> None:
        self.sets = sets
        self.rows: dict[int, Row] = {}

    def update(self, batch_update: Any) -> None:
        if batch_update is not None:
            added = [
                (index, constrained_row(self.sets, getattr(params, "extra_args", None), output_ids, f"row {index}"))
                for index, params, _prompt_ids, output_ids in batch_update.added
            ]
            for index in batch_update.removed:
                self.rows.pop(index, None)
            for index, row in added:
                if row is None:
                    self.rows.pop(index, None)  # the slot's previous occupant, if any
                else:
                    self.rows[index] = row
            for first, second, direction in batch_update.moved:
                moving, other = self.rows.pop(first, None), self.rows.pop(second, None)
                if moving is not None:
                    self.rows[second] = moving
                if other is not None and getattr(direction, "name", direction) == "SWAP":
                    self.rows[first] = other
        catch_up_rows(self.sets, self.rows)

    def apply(self, logits: Any) -> Any:
        return mask_rows(logits, self.rows) if self.rows else logits


_SCHEMA_SLOT = -2  # set_of marker: the slot's request follows a JSON schema, on the host


class SlotStates:
    """vLLM Model Runner V2 bookkeeping: the state of every request slot, on the device.

    ``add`` (at admission) records the slot's set and schedules a reset; ``flush``
    writes the resets; ``apply`` advances each constrained row by the token it was fed
    (``ctx.input_ids``) and masks all of a set's rows in one device operation. The
    number of output tokens a row has is ``seq_len - prompt_len`` from host arrays, so
    nothing waits for the device; a slot that has more than one token to catch up (a
    request resumed after preemption) replays them from ``all_token_ids``.
    """

    def __init__(self, sets: CompiledSets, req_states: Any) -> None:
        import torch

        self.sets = sets
        self.req_states = req_states
        slots = int(req_states.max_num_reqs)
        self.compiled: list[CompiledSet] = []  # the sets in use, indexed by set_of
        self.set_of = np.full(slots, -1, dtype=np.int64)  # per slot: its set's index, -1 for none
        self.consumed = np.zeros(slots, dtype=np.int64)
        self.states = torch.zeros(slots, dtype=torch.int64, device=req_states.device)
        self._resets: dict[int, int] = {}  # slot -> its set's initial state, written at the next flush
        self.schema_rows: dict[int, Row] = {}  # slots of JSON-schema requests

    def add(self, slot: int, params: Any) -> bool:
        row = constrained_row(self.sets, getattr(params, "extra_args", None), (), f"in slot {slot}")
        self.consumed[slot] = 0
        self.schema_rows.pop(slot, None)
        if row is None:
            self.set_of[slot] = -1
            return False
        if row.matcher is not None:  # a JSON schema: followed on the host
            self.schema_rows[slot] = row
            self.set_of[slot] = _SCHEMA_SLOT
            return True
        self._use(slot, row.compiled)
        return True

    def _use(self, slot: int, compiled: CompiledSet) -> None:
        """Give ``slot`` the set ``compiled`` (the EOS-only set for a request whose set failed)."""
        known = next((i for i, c in enumerate(self.compiled) if c is compiled), None)
        if known is None:
            in_use = set(self.set_of[self.set_of >= 0].tolist())
            known = next((i for i in range(len(self.compiled)) if i not in in_use), len(self.compiled))
            if known == len(self.compiled):
                self.compiled.append(compiled)
            else:
                self.compiled[known] = compiled  # reuse the entry of a set no slot holds any more
        self.set_of[slot] = known
        automaton = compiled.automaton
        self._resets[slot] = 0 if automaton is None else automaton.initial_state

    def flush(self) -> None:
        if not self._resets:
            return
        import torch

        device = self.states.device  # (a compiled set starts at node 0; an updated set at a pair of states)
        slots = torch.tensor(list(self._resets), dtype=torch.int64, device=device)
        self.states[slots] = torch.tensor(list(self._resets.values()), dtype=torch.int64, device=device)
        self._resets.clear()

    def apply(self, logits: Any, ctx: Any) -> Any:
        import torch

        self.flush()
        slots = np.asarray(ctx.idx_mapping_np, dtype=np.int64)
        if len(slots) != logits.shape[0]:
            raise RuntimeError(
                f"triemask: {logits.shape[0]} logits rows for {len(slots)} requests: speculative decoding "
                "is not supported by the triemask processor"
            )
        produced = np.maximum(
            np.asarray(ctx.seq_lens_upper_bound_np, dtype=np.int64)[: len(slots)]
            - self.req_states.prompt_len.np[slots],
            0,
        )
        if (self.set_of[slots] == _SCHEMA_SLOT).any():
            self._schema_rows(logits, ctx, slots, produced)
            self.flush()  # rows ended there were given the EOS-only set
        row_sets = self.set_of[slots]
        for index in np.unique(row_sets[row_sets >= 0]).tolist():
            on_device = self.compiled[index].device_automaton
            rows = np.flatnonzero(row_sets == index)
            row_slots = slots[rows]
            new = produced[rows] - self.consumed[row_slots]
            stepping = new == 1  # the usual case: one new token, the one fed to the model this step
            if stepping.any():
                where = torch.from_numpy(rows[stepping]).to(logits.device, non_blocking=True)
                targets = torch.from_numpy(row_slots[stepping]).to(self.states.device)
                self.states[targets] = on_device.next_states(self.states[targets], ctx.input_ids[where])
            for slot, count in zip(row_slots[new > 1].tolist(), produced[rows][new > 1].tolist(), strict=True):
                self._replay(on_device, slot, count)  # rare: a request resumed after preemption
            self.consumed[row_slots] = produced[rows]
            where = torch.from_numpy(rows).to(logits.device, non_blocking=True)
            on_device.mask_logits(logits, self.states[torch.from_numpy(row_slots).to(self.states.device)], where)
        return logits

    def _schema_rows(self, logits: Any, ctx: Any, slots: Any, produced: Any) -> None:
        """Advance the JSON-schema rows on the host (their new tokens come over in one
        copy) and mask them; a row whose token the schema rejects ends alone."""
        rows = np.flatnonzero(self.set_of[slots] == _SCHEMA_SLOT)
        fed = ctx.input_ids[rows.tolist()].tolist() if rows.size else []
        matchers: dict[int, SchemaMatcher] = {}
        for row, token in zip(rows.tolist(), fed, strict=True):
            slot = int(slots[row])
            entry = self.schema_rows[slot]
            new = int(produced[row] - self.consumed[slot])
            if new == 1:
                tokens = [int(token)]
            else:  # a request resumed after preemption: all of its output so far
                start = int(self.req_states.prompt_len.np[slot])
                tokens = self.req_states.all_token_ids.gpu[slot, start : start + int(produced[row])].tolist()
                tokens = tokens[int(self.consumed[slot]) :] if new > 1 else []
            try:
                entry.output_ids = [*entry.output_ids, *tokens]
                entry.catch_up()
            except Exception as error:
                logger.error("triemask: request in slot %s ended (only EOS allowed): %s", slot, error)
                del self.schema_rows[slot]
                self._use(slot, self.sets.ended())
                continue
            self.consumed[slot] = produced[row]
            assert entry.matcher is not None
            matchers[row] = entry.matcher
        if matchers:
            mask_schema_rows(logits, matchers)

    def _replay(self, on_device: Any, slot: int, produced: int) -> None:
        """Walk a slot from the initial state through all of its output tokens."""
        start = int(self.req_states.prompt_len.np[slot])
        tokens = self.req_states.all_token_ids.gpu[slot, start : start + produced]
        initial = self.compiled[int(self.set_of[slot])].automaton
        state = self.states[slot : slot + 1].clone().fill_(0 if initial is None else initial.initial_state)
        for token in tokens.split(1):
            state = on_device.next_states(state, token)
        self.states[slot] = state[0]
