"""SGLang: a custom logit processor and a grammar backend, no patch to SGLang.

Custom logit processor (server started with ``--enable-custom-logit-processor``)::

    {"text": "...", "custom_logit_processor": TriemaskLogitProcessor.to_str(),
     "sampling_params": {"custom_params": {"triemask_values": ["yes", "no"]}}}

Each row's state is advanced from that request's ``output_ids``; all rows of one set are
masked with one device operation. Sets are compiled on first sight against the
request's tokenizer and cached (``$TRIEMASK_CACHE_BYTES``); ``triemask_set`` names a set
registered from ``$TRIEMASK_SETS``; ``triemask_regex`` (a finite regex) and
``triemask_format`` (``date``, ``uuid``...) constrain to a language instead. SGLang
runs the processor inside the forward pass and has no admission hook for
``custom_params``, so the processor checks a request's arguments (and the limits of
``$TRIEMASK_MAX_*``) the first time it sees it, once: a request that fails any check,
or whose set does not compile, is finished with an abort naming the reason
(``req.set_finish_with_abort``) and its row allows only EOS. Nothing raises out of the
forward pass.

Grammar backend (``--grammar-backend triemask`` once :func:`register` has run, e.g. from
the ``sglang.srt.plugins`` entry point this package declares): SGLang has no ``choice``
request type, so the backend takes the alternations SGLang requests already carry, a
``regex`` such as ``(yes|no|maybe)`` or an ``ebnf`` such as ``root ::= "yes" | "no"``,
and compiles them with triemask, as it does any regex whose language is finite
(``[0-9]{4}-[0-9]{2}``: its minimal acyclic automaton); a ``json_schema`` with a large
enum field (at least ``triemask.DEFAULT_MIN_ENUM_VALUES`` values) compiles with
triemask's mixed schemas (enums in tries, structure in xgrammar), and every other
grammar goes to xgrammar unchanged: the paper's constraint-aware dispatch. A grammar
that cannot be compiled (an oversize set, a value the vocabulary cannot spell, a lone
surrogate) is SGLang's invalid-grammar result, and SGLang aborts that request alone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from ..automata import TrieAutomaton, whole_characters
from ..base import BoundedLRU, MemoryLimitError, StateError
from ..compiler import Compiler
from ..matcher import Matcher
from ..schemas import (
    TOO_DEEP,
    CompiledSchema,
    SchemaMatcher,
    dispatched_cost,
    load_schema,
)
from ..sets import dag_of_pattern
from .serving.compiled_sets import CompiledSets, compile_registered, hf_vocabulary
from .serving.limits import FORMAT_ARG, REGEX_ARG, SET_ARG, VALUES_ARG, Limits
from .serving.requests import engine_dispatch, literal_alternatives, log_unenforced, requested_pattern, requested_values
from .serving.rows import Row, catch_up_rows, mask_rows

try:
    import torch
    from sglang.srt.constrained.base_grammar_backend import BaseGrammarBackend, BaseGrammarObject
    from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor
except ImportError as error:  # pragma: no cover - exercised only without SGLang
    raise ImportError("triemask.integrations.sglang needs SGLang: pip install sglang") from error

try:  # SGLang's marker for a grammar that failed to compile (older releases used None)
    from sglang.srt.constrained.base_grammar_backend import INVALID_GRAMMAR_OBJ as _INVALID_GRAMMAR
except ImportError:  # pragma: no cover - older SGLang
    _INVALID_GRAMMAR = None

logger = logging.getLogger("triemask")

__all__ = ["TriemaskGrammar", "TriemaskGrammarBackend", "TriemaskLogitProcessor", "register"]

_LOCK = threading.Lock()
MAX_ROLLBACK_TOKENS = 200
"""How many tokens a grammar can undo (SGLang's xgrammar grammars keep as many)."""
_SETS: dict[tuple[int, int, str], CompiledSets] = {}  # per tokenizer, logits width and device
# per request id, with the set cache it belongs to; processors are re-instantiated per batch
_ROWS: BoundedLRU[str, tuple[Row, CompiledSets]] = BoundedLRU(1 << 16)


def _sets_for(req: Any, device: Any) -> CompiledSets:
    """The compiled sets of the request's tokenizer; the first request of a tokenizer
    compiles the registered sets (SGLang gives a custom processor no start-up hook)."""
    key = (id(req.tokenizer), int(req.vocab_size), str(device))
    with _LOCK:
        if key not in _SETS:
            vocab = hf_vocabulary(req.tokenizer, int(req.vocab_size), getattr(req, "eos_token_ids", None))
            sets = CompiledSets(Compiler(vocab), device)
            try:
                compile_registered(sets)
            except ValueError as error:  # a request naming the broken set fails on its own
                logger.error("triemask: %s", error)
            _SETS[key] = sets
        return _SETS[key]


_ROW_ARGS = (VALUES_ARG, SET_ARG, REGEX_ARG, FORMAT_ARG)


class TriemaskLogitProcessor(CustomLogitProcessor):  # type: ignore[misc]
    """Keep each request that passes ``triemask_values`` / ``triemask_set`` (or a finite
    ``triemask_regex`` / ``triemask_format``) in its ``custom_params`` inside that set or
    language; other rows are returned unchanged."""

    def __call__(self, logits: Any, custom_param_list: list[dict[str, Any] | None] | None = None) -> Any:
        rows: dict[int, Row] = {}
        for index, params in enumerate(custom_param_list or []):
            if not isinstance(params, Mapping) or not any(key in params for key in _ROW_ARGS):
                continue
            req: Any = params.get("__req__")
            if req is None:  # SGLang always passes the request; without it there is no state to follow
                continue
            with _LOCK:
                known = _ROWS.get(req.rid)
            if known is None or len(req.output_ids) < known[0].consumed:  # a new request (or one restarted)
                known = self._admit(req, params, logits.device)
                if known is None:
                    continue
            row, sets = known
            row.output_ids = req.output_ids
            catch_up_rows(sets, {req.rid: row})
            rows[index] = row
        return mask_rows(logits, rows) if rows else logits

    @staticmethod
    def _admit(req: Any, params: Mapping[str, Any], device: Any) -> tuple[Row, CompiledSets] | None:
        """The row of a request seen for the first time; a request that fails is aborted
        (finished with the reason) and given an EOS-only row. Never raises."""
        try:
            sets = _sets_for(req, device)
        except Exception as error:
            _abort(req, f"triemask: the request's tokenizer cannot be used: {error}")
            return None
        try:
            arguments = {k: v for k, v in params.items() if k != "__req__"}
            values = requested_values(arguments) or requested_pattern(arguments)
            if values is None:
                return None  # the keys are there, but empty: no constraint
            row = Row(sets.get(values), req.output_ids)
        except Exception as error:
            _abort(req, f"triemask: {error}")
            row = Row.ended(sets, req.output_ids)
        with _LOCK:
            _ROWS.put(req.rid, (row, sets))
        return row, sets


def _abort(req: Any, message: str) -> None:
    """Finish ``req`` with an error (SGLang reports it to the client); logged either way."""
    logger.error("%s (request %s)", message, getattr(req, "rid", "?"))
    finish = getattr(req, "set_finish_with_abort", None)
    if callable(finish):
        try:
            finish(message)
        except Exception:
            logger.exception("triemask: could not abort request %s", getattr(req, "rid", "?"))


class TriemaskGrammar(BaseGrammarObject):  # type: ignore[misc]
    """One request's position in a compiled set, behind SGLang's grammar-object interface
    (token bitmasks in the xgrammar layout SGLang's other backends use)."""

    def __init__(self, automaton: TrieAutomaton | CompiledSchema) -> None:
        super().__init__()
        self.compiled = automaton
        # a SchemaMatcher for a compiled JSON schema; the rollback depth of SGLang's xgrammar
        # grammars (a jump's retokenization may undo the last tokens)
        self.matcher: Any = Matcher(automaton, max_rollback=MAX_ROLLBACK_TOKENS)

    def accept_token(self, token: int) -> None:
        if not self.matcher.accept_token(int(token)):  # SGLang aborts the request on ValueError, as for xgrammar's
            raise ValueError(f"triemask: token {token} is not allowed here")

    def rollback(self, k: int) -> None:
        self.matcher.rollback(k)

    def is_terminated(self) -> bool:
        return bool(self.matcher.is_terminated())

    def allocate_vocab_mask(self, vocab_size: int, batch_size: int, device: Any) -> Any:
        return torch.full((batch_size, (vocab_size + 31) // 32), -1, dtype=torch.int32)

    def fill_vocab_mask(self, vocab_mask: Any, idx: int) -> None:
        if isinstance(self.matcher, SchemaMatcher):
            self.matcher.fill_next_token_bitmask(vocab_mask, idx)
        else:
            self.matcher.automaton.fill_bitmask(vocab_mask, [self.matcher.state], rows=[idx])

    @staticmethod
    def reset_vocab_mask(vocab_mask: Any) -> None:
        vocab_mask.fill_(-1)

    @staticmethod
    def move_vocab_mask(vocab_mask: Any, device: Any) -> Any:
        return vocab_mask.to(device, non_blocking=True)

    @staticmethod
    def apply_vocab_mask(logits: Any, vocab_mask: Any) -> None:
        vocab_mask = vocab_mask.to(logits.device, non_blocking=True)
        try:  # SGLang depends on xgrammar, whose kernel applies this layout in place
            from xgrammar import apply_token_bitmask_inplace
        except ImportError:
            _apply_bitmask(logits, vocab_mask)
        else:
            apply_token_bitmask_inplace(logits, vocab_mask)

    def copy(self) -> TriemaskGrammar:
        return TriemaskGrammar(self.compiled)

    def try_jump_forward(self, tokenizer: Any) -> tuple[list[int], str] | None:
        """SGLang's jump-forward hook: the text every continuation begins with, or None."""
        forced = self.matcher.find_jump_forward_string()
        text = forced if isinstance(forced, str) else whole_characters(forced)
        return ([], text) if text else None

    def jump_forward_str_state(self, helper: tuple[list[int], str]) -> tuple[str, int]:
        return helper[1], -1

    def jump_and_retokenize(self, old_output_ids: list[int], new_output_ids: list[int], next_state: int) -> None:
        """After SGLang appended the jump's text and tokenized the output again: undo the
        tokens past the common prefix of the old and new ids, accept the new ones."""
        common = next(
            (i for i, (old, new) in enumerate(zip(old_output_ids, new_output_ids, strict=False)) if old != new),
            min(len(old_output_ids), len(new_output_ids)),
        )
        if common < len(old_output_ids):
            try:
                self.matcher.rollback(len(old_output_ids) - common)
            except StateError as error:  # (beyond MAX_ROLLBACK_TOKENS: SGLang aborts the request)
                raise ValueError(f"triemask: cannot retokenize after a jump: {error}") from None
        for token in new_output_ids[common:]:
            self.accept_token(token)


class TriemaskGrammarBackend(BaseGrammarBackend):  # type: ignore[misc]
    """Alternations of literals (regex or EBNF) and finite regexes (``\\d{4}-\\d{2}``, no
    ``*`` or ``+``) compile with triemask; anything else goes to ``fallback``
    (xgrammar's backend by default, built lazily)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Any = None, fallback: Any = None) -> None:
        super().__init__()
        self.compiler = Compiler(hf_vocabulary(tokenizer, vocab_size, eos_token_ids))
        self.limits = Limits.from_env()
        self._fallback = fallback
        self._fallback_args = (tokenizer, vocab_size, eos_token_ids)

    def _other(self) -> Any:
        if self._fallback is None:
            from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend

            tokenizer, vocab_size, eos = self._fallback_args
            self._fallback = XGrammarGrammarBackend(
                tokenizer, vocab_size=vocab_size, model_eos_token_ids=list(eos) if eos else None
            )
        return self._fallback

    def _dispatch(self, kind: str, text: str) -> Any:
        try:
            values = literal_alternatives(kind, text)
        except Exception as error:
            logger.error("triemask: invalid %s grammar: %s", kind, error)
            return _INVALID_GRAMMAR
        if (
            values is None
            and kind == "regex"
            and len(text.encode("utf-8", "surrogatepass")) <= self.limits.max_pattern_bytes
        ):
            try:
                dag_of_pattern(text)  # finite and within this engine's syntax?
            except Exception:  # infinite, or a construct only xgrammar reads: xgrammar decides
                return self._other().dispatch_regex(text)
            try:
                return TriemaskGrammar(self.compiler.compile_regex(text, max_bytes=self.limits.max_automaton_bytes))
            except MemoryLimitError:  # finite but wide (.{0,1000}): xgrammar's regex costs less
                return self._other().dispatch_regex(text)
            except Exception as error:
                logger.error("triemask: invalid regex grammar: %s", error)
                return _INVALID_GRAMMAR
        if values is None:
            return getattr(self._other(), f"dispatch_{kind}")(text)
        try:
            requested_values({"triemask_values": values}, self.limits)  # the same limits as requests
            return TriemaskGrammar(self.compiler.compile(values))
        except Exception as error:
            logger.error("triemask: invalid %s grammar (%d alternatives): %s", kind, len(values), error)
            return _INVALID_GRAMMAR

    def dispatch_regex(self, key_string: str) -> Any:
        return self._dispatch("regex", key_string)

    def dispatch_ebnf(self, key_string: str) -> Any:
        return self._dispatch("ebnf", key_string)

    def dispatch_json(self, key_string: str) -> Any:
        """Constraint-aware dispatch: a schema with an enum of at least
        ``DEFAULT_MIN_ENUM_VALUES`` values, or a discriminated union of at least
        ``DEFAULT_MIN_UNION_BRANCHES`` branches (the schema SGLang builds for a tool request
        with ``tool_choice="required"``), compiles with triemask (enums and discriminators in
        tries, the structure in xgrammar, the options of SGLang's xgrammar backend); any
        other schema goes to xgrammar's backend unchanged."""
        try:
            schema = load_schema(key_string)
        except Exception as error:  # not a schema triemask reads ("$$ANY$$", bad JSON): xgrammar decides
            if str(error).startswith(TOO_DEEP):  # ... unless it is too deep for a bounded compile there too
                logger.error("triemask: invalid json_schema: %s", error)
                return _INVALID_GRAMMAR
            return self._other().dispatch_json(key_string)
        try:
            structural, sites, _ = engine_dispatch(schema)
            if not sites:
                return self._other().dispatch_json(key_string)
            if len(key_string.encode("utf-8", "surrogatepass")) > self.limits.max_set_bytes:
                raise ValueError(f"the schema exceeds the server's limit of {self.limits.max_set_bytes} bytes")
            cost = dispatched_cost(schema, structural, sites).milliseconds  # (what xgrammar compiles)
            if cost > self.limits.max_schema_cost_ms:
                raise ValueError(f"the schema would take the structural engine about {cost:,.0f} ms to compile")
            any_whitespace = bool(getattr(self._fallback, "any_whitespace", True))
            compiled = self.compiler.compile_json_schema(
                key_string, any_whitespace=any_whitespace, unsupported="ignore"
            )
            if compiled.unenforced:
                log_unenforced(compiled.unenforced)
            return TriemaskGrammar(compiled)
        except Exception as error:
            logger.error("triemask: invalid json_schema: %s", error)
            return _INVALID_GRAMMAR

    def dispatch_structural_tag(self, key_string: str) -> Any:
        return self._other().dispatch_structural_tag(key_string)


def _apply_bitmask(logits: Any, vocab_mask: Any) -> None:
    """Set the logits of tokens whose bit is clear to -inf (torch only, any device)."""
    rows, width = logits.shape[0], logits.shape[-1]
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    allowed = ((vocab_mask[:rows].unsqueeze(-1) >> shifts) & 1).view(rows, -1)[:, :width].bool()
    if allowed.shape[1] < width:  # logits wider than the mask: the extra columns are closed
        allowed = torch.nn.functional.pad(allowed, (0, width - allowed.shape[1]))
    logits.masked_fill_(~allowed, float("-inf"))


def _create_backend(server_args: Any, tokenizer: Any, vocab_size: int, eos_token_ids: Any = None) -> Any:
    return TriemaskGrammarBackend(tokenizer, vocab_size, eos_token_ids)


def register() -> None:
    """Make ``--grammar-backend triemask`` available (the ``sglang.srt.plugins`` entry point)."""
    from sglang.srt.constrained.base_grammar_backend import register_grammar_backend

    register_grammar_backend("triemask", _create_backend)
    try:
        from sglang.srt.server_args import GRAMMAR_BACKEND_CHOICES, add_grammar_backend_choices
    except ImportError:  # pragma: no cover - older SGLang validated names elsewhere
        return
    if "triemask" not in GRAMMAR_BACKEND_CHOICES:
        add_grammar_backend_choices(["triemask"])
