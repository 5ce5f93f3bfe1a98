"""Compiled sets per engine: a byte-bounded cache of compiled requests."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...automata import TrieAutomaton
from ...base import BoundedLRU, ValueSetError
from ...cache import CompileCache
from ...compiler import Compiler
from ...schemas import CompiledSchema, prepare_schemas
from ...vocab import Vocabulary
from .limits import SCHEMA_ARG, SETS_ENV, Limits
from .registry import registered_generation, registered_sets
from .requests import PatternRequest, SchemaRequest, log_unenforced

logger = logging.getLogger("triemask")


@dataclass
class CompiledSet:
    """One compiled set, with its arrays on the engine's device (or a compiled JSON
    schema or tool list, whose rows are masked from host bitmasks)."""

    automaton: TrieAutomaton | None
    device_automaton: Any  # triemask.integrations.torch.DeviceAutomaton
    nbytes: int
    schema: CompiledSchema | None = None


class SetCompileError(Exception):
    """A set that could not be compiled for the engine's vocabulary (kept as such)."""


class CompiledSets:
    """Compile sets on first sight, through the core :class:`~triemask.CompileCache`
    (bounded in bytes, keyed by vocabulary and set fingerprint: a set reordered or with
    duplicates is one entry), with each set's arrays on the engine's device.

    Parameters
    ----------
    compiler : Compiler
        The per-tokenizer index of the engine's model.
    device : torch.device
        Where each set's arrays go.
    max_bytes : int, optional
        Bound on the bytes held (host + device); default ``$TRIEMASK_CACHE_BYTES`` or 1 GiB.
        A set in use by a request stays alive through that request even when evicted.
        Pinned sets (:meth:`pin`, the registered ones) are held outside the bound.
    limits : Limits, optional
        The request limits (default ``Limits.from_env()``): a regex's automaton is compiled
        within ``max_automaton_bytes``.
    """

    _MAX_FAILURES = 1024  # failed sets remembered (their keys and messages only)

    def __init__(
        self, compiler: Compiler, device: Any, max_bytes: int | None = None, limits: Limits | None = None
    ) -> None:
        self.compiler = compiler
        self.limits = Limits.from_env() if limits is None else limits
        self.device = device
        self.cache = CompileCache(max_bytes)
        self._pinned: dict[Any, CompiledSet] = {}
        self._failures: BoundedLRU[Any, str] = BoundedLRU(self._MAX_FAILURES)
        self._lock = threading.Lock()
        self._ended: CompiledSet | None = None
        self._generation = 0  # of the registered sets pinned here
        self._registered_keys: set[Any] | None = None  # their keys, once a reload made them differ
        # name -> (values, key), as last followed: a changed set is updated from the old one
        self._registered_names: dict[str, tuple[list[str], Any]] = {}

    @property
    def max_bytes(self) -> int:
        return self.cache.max_bytes

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached sets (the pinned ones excluded)."""
        return int(self.cache.stats()["bytes"])

    # What an entry holds besides its arrays (Python and tensor objects, allocator slack):
    # measured at about 20 KiB per set in resident memory, 7x the arrays of a small set.
    ENTRY_OVERHEAD = 24 << 10

    def _key(self, request: Sequence[str] | SchemaRequest | PatternRequest) -> tuple[Any, ...]:
        vocab = self.compiler.vocab.fingerprint
        if isinstance(request, SchemaRequest):
            return ("schema", vocab, request.kind, request.text)
        if isinstance(request, PatternRequest):
            return ("regex", vocab, request.pattern, str(self.device))
        return ("set", vocab, self.cache.set_key(self.compiler, request), str(self.device))

    def _compile(self, values: Sequence[str] | PatternRequest) -> CompiledSet:
        """A set (or a finite pattern) compiled, with its arrays on the device."""
        automaton: TrieAutomaton
        if isinstance(values, PatternRequest):  # bounded: a short pattern can ask for gigabytes
            automaton = self.compiler.compile_regex(values.pattern, max_bytes=self.limits.max_automaton_bytes)
        else:
            automaton = self.compiler.compile(values)
        return self._on_device(automaton)

    def _on_device(self, automaton: TrieAutomaton) -> CompiledSet:
        from ..torch import device_automaton

        on_device = device_automaton(automaton, self.device)
        return CompiledSet(automaton, on_device, automaton.memory_bytes + on_device.memory_bytes + self.ENTRY_OVERHEAD)

    def _compile_schema(self, request: SchemaRequest) -> CompiledSet:
        given = json.loads(request.text)
        if request.kind == SCHEMA_ARG:  # (served as xgrammar would serve it; what it does not enforce, logged)
            schema: CompiledSchema = self.compiler.compile_json_schema(given, unsupported="ignore")
            if schema.unenforced:
                log_unenforced(schema.unenforced)
        else:  # (a tool's arguments compile when it is chosen: what they do not enforce, logged at admission)
            schema = self.compiler.compile_tools(given, unsupported="ignore")
        return CompiledSet(None, None, schema.memory_bytes + self.ENTRY_OVERHEAD, schema)

    def get(self, values: Sequence[str] | SchemaRequest | PatternRequest) -> CompiledSet:
        """The compiled set (or schema, or pattern); raises :class:`SetCompileError` (with
        the reason) for one that cannot be compiled, now or at an earlier request."""
        try:
            key = self._key(values)
        except ValueSetError as error:  # not a set of strings: admission checks make this rare
            raise SetCompileError(f"{type(error).__name__}: {error}"[:500]) from error
        self._follow_reloads()
        with self._lock:
            pinned = self._pinned.get(key)
            failure = self._failures.get(key)
            registered = self._registered_keys is not None and key in self._registered_keys
        if pinned is not None:
            return pinned
        if failure is not None:
            raise SetCompileError(failure)
        if registered and isinstance(values, list):  # a registered set updated by name: pinned from now on
            try:
                return self.pin(values)
            except Exception as error:
                raise SetCompileError(f"{type(error).__name__}: {error}"[:500]) from error

        def build() -> CompiledSet:
            if isinstance(values, SchemaRequest):
                return self._compile_schema(values)
            return self._compile(values)

        try:
            return self.cache.get(key, build, lambda entry: entry.nbytes)
        except Exception as error:
            message = f"{type(error).__name__}: {error}"[:500]
            with self._lock:
                self._failures.put(key, message)
            raise SetCompileError(message) from error

    def _follow_reloads(self) -> None:
        """After the registered sets were reloaded: a set changed under its name is updated from
        its pinned automaton (:meth:`~triemask.TrieAutomaton.with_values`: milliseconds for a
        change of a few percent, a recompile beyond) and pinned under its new values; the sets
        no longer registered are unpinned (new names are pinned when first requested)."""
        generation = registered_generation()
        if generation == self._generation:
            return
        try:
            registered = registered_sets()
            keys = {name: self._key(values) for name, values in registered.items()}
        except ValueError:
            return
        with self._lock:
            if self._generation == generation:  # another thread followed it meanwhile
                return
            self._generation = generation
            previous = self._registered_names
            self._registered_names = {name: (values, keys[name]) for name, values in registered.items()}
        for name, values in registered.items():
            if name in previous:
                self._update_pinned(previous[name], values, keys[name])
        with self._lock:
            self._registered_keys = set(keys.values())
            for key in [key for key in self._pinned if key not in self._registered_keys]:
                del self._pinned[key]

    def _update_pinned(self, old: tuple[list[str], Any], values: Sequence[str], key: Any) -> None:
        """Pin ``values`` as an update of the pinned set ``old`` (its values and key; nothing when
        it is not pinned or the update fails: the set is then compiled when first requested)."""
        old_values, old_key = old
        with self._lock:
            entry = None if key in self._pinned else self._pinned.get(old_key)
        if entry is None or entry.automaton is None:
            return
        kept, now = set(old_values), set(values)
        try:
            updated = entry.automaton.with_values(added=sorted(now - kept), removed=sorted(kept - now))
            entry = self._on_device(updated)
        except Exception as error:  # (logged: the set is compiled whole at its first request)
            logger.warning("triemask: registered set not updated in place, it will be recompiled: %s", error)
            return
        with self._lock:
            self._pinned.setdefault(key, entry)

    def pin_registered(self, registered: dict[str, list[str]]) -> int:
        """Pin every registered set (server start-up) and remember them by name, so that a set
        changed under its name is updated from its pinned automaton; returns their bytes.
        Raises ValueError naming a set that does not compile."""
        keys, total = {}, 0
        for name, values in registered.items():
            try:
                keys[name] = self._key(values)
                total += self._pin(values, keys[name]).nbytes
            except Exception as error:  # noqa: PERF203 - the error path only
                raise ValueError(f"{SETS_ENV}: set {name!r} does not compile: {error}") from error
        with self._lock:
            self._registered_names = {name: (values, keys[name]) for name, values in registered.items()}
            self._generation = registered_generation()
        return total

    def pin(self, values: Sequence[str]) -> CompiledSet:
        """Compile ``values`` now and keep them for the life of the process (raises on failure)."""
        return self._pin(values, self._key(values))

    def _pin(self, values: Sequence[str], key: tuple[Any, ...]) -> CompiledSet:
        with self._lock:
            entry = self._pinned.get(key)
        if entry is None:
            entry = self._compile(values)
            with self._lock:
                entry = self._pinned.setdefault(key, entry)
        return entry

    def ended(self) -> CompiledSet:
        """A set whose initial state allows EOS only: the rows of failed requests use it."""
        if self._ended is None:
            self._ended = self._compile([""])
        return self._ended

    def __len__(self) -> int:
        return len(self.cache)


def compile_registered(sets: CompiledSets) -> None:
    """Compile every set of ``$TRIEMASK_SETS`` now (server start-up), with one summary log
    line; an unreadable folder or a set that does not compile stops the start-up."""
    started = time.perf_counter()
    Limits.from_env()  # a malformed limit setting stops the start-up, not the first request
    registered = registered_sets()
    total = sets.pin_registered(registered)
    # what every schema of this vocabulary shares, now rather than in the first schema's step
    # (without xgrammar, schema requests end alone with that reason)
    with contextlib.suppress(ImportError):
        prepare_schemas(sets.compiler.vocab)
    if registered:
        logger.info(
            "triemask: %d registered sets (%s; %d values) compiled in %.2f s, %.1f MiB",
            len(registered),
            ", ".join(sorted(registered)),
            sum(map(len, registered.values())),
            time.perf_counter() - started,
            total / (1 << 20),
        )


def hf_vocabulary(tokenizer: Any, vocab_size: int, eos_token_ids: Any = None) -> Vocabulary:
    """The :class:`Vocabulary` of a Hugging Face tokenizer at the model's logits width; EOS
    ids are the tokenizer's and ``eos_token_ids`` (the other tokens the engine stops at)."""
    eos = ({tokenizer.eos_token_id} | set(eos_token_ids or ())) - {None}
    return Vocabulary.from_huggingface(tokenizer, vocab_size=vocab_size, eos_token_ids=sorted(eos))


_ENGINE_SETS: dict[tuple[Any, ...], CompiledSets] = {}
_ENGINE_SETS_LOCK = threading.Lock()


def compiled_sets_for_model(
    tokenizer_name: str, vocab_size: int, device: Any, *, revision: str | None = None, trust_remote_code: bool = False
) -> CompiledSets:
    """The process-wide :class:`CompiledSets` of an engine's model and device.

    The tokenizer is loaded with transformers; EOS ids are the tokenizer's and those of
    the model's generation config (the tokens the engine stops at).
    """
    key = (tokenizer_name, revision, vocab_size, str(device))
    with _ENGINE_SETS_LOCK:
        if key not in _ENGINE_SETS:
            from transformers import AutoTokenizer, GenerationConfig

            tokenizer = AutoTokenizer.from_pretrained(
                tokenizer_name, revision=revision, trust_remote_code=trust_remote_code
            )
            try:
                generation = GenerationConfig.from_pretrained(tokenizer_name, revision=revision or "main").eos_token_id
            except OSError:  # no generation config: the tokenizer's EOS is the one
                generation = None
            extra = generation if isinstance(generation, list | tuple) else [generation]
            _ENGINE_SETS[key] = CompiledSets(Compiler(hf_vocabulary(tokenizer, vocab_size, extra)), device)
        return _ENGINE_SETS[key]
