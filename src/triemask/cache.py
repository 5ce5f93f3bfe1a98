"""One compile cache for a process: compiled sets kept by vocabulary and set fingerprint
(and compiled schemas by their JSON).

Every adapter (transformers, vLLM, SGLang) compiles through a :class:`CompileCache`, so
that a set requested again, in any order and with any duplicates, is compiled once. The
cache is bounded in bytes (least recently used first out; a single entry larger than the
bound is returned, not kept), thread-safe (a set requested by several threads at once is
compiled once: the others wait for it), and may keep a second tier on disk in triemask's
file format (also bounded), so that a restarted process maps what an earlier one compiled.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from .automata import TrieAutomaton
from .base import ArgumentTypeError, AutomatonFileError, BoundedLRU, ValueSetError, integer, storage, values_fingerprint
from .compiler import Compiler
from .schemas import CompiledSchema, CompiledTools

__all__ = ["DEFAULT_COMPILE_CACHE_BYTES", "CompileCache", "default_compile_cache", "values_fingerprint"]

DEFAULT_COMPILE_CACHE_BYTES = 1 << 30
"""The default bound of a :class:`CompileCache` in memory (1 GiB; ``$TRIEMASK_CACHE_BYTES``)."""

_ALIASES = 65_536  # exact request -> set fingerprint, remembered (about 200 bytes each)
_T = TypeVar("_T")


def _exact_key(values: Sequence[Any]) -> str | None:
    """A key of the values in their given order (cheap), or None when they are not all str."""
    if not all(type(v) is str for v in values):
        return None
    digest = hashlib.blake2b(digest_size=16)
    digest.update(len(values).to_bytes(8, "little"))
    digest.update("\x00".join(values).encode("utf-8", "surrogatepass"))
    digest.update(np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values)).tobytes())
    return digest.hexdigest()


class CompileCache:
    """Compiled sets and schemas (and anything else an adapter builds per request), bounded in bytes.

    Parameters
    ----------
    max_bytes : int, optional
        The bound in memory: default ``$TRIEMASK_CACHE_BYTES``, else 1 GiB. An entry's size
        is the automaton's ``memory_bytes`` (or what the adapter declares).
    directory : str or path, optional
        A second tier on disk: compiled sets and schemas are saved there (triemask's file
        format, named by a hash of their key) and mapped back by later processes. None: memory only.
        A folder owned by another user or writable by others is not used (one warning): any
        file put there would be loaded.
    max_disk_bytes : int
        The bound of the disk tier (default 4 GiB); the least recently written files go first.

    Examples
    --------
    >>> from triemask import CompileCache, Compiler, Vocabulary
    >>> compiler = Compiler(Vocabulary([b"a", b"b", None], eos_token_ids=2), disk_cache=False)
    >>> cache = CompileCache()
    >>> first = cache.compile(compiler, ["a", "b"])
    >>> cache.compile(compiler, ["b", "a", "a"]) is first  # the same set
    True
    >>> cache.stats()["hits"], cache.stats()["misses"]
    (1, 1)
    """

    def __init__(
        self,
        max_bytes: int | None = None,
        *,
        directory: str | os.PathLike[str] | None = None,
        max_disk_bytes: int = 4 << 30,
    ) -> None:
        if max_bytes is None:
            max_bytes = int(os.environ.get("TRIEMASK_CACHE_BYTES", DEFAULT_COMPILE_CACHE_BYTES))
        self.max_bytes = integer(max_bytes, "max_bytes", ValueSetError, "a non-negative integer")
        self.max_disk_bytes = integer(max_disk_bytes, "max_disk_bytes", ValueSetError, "a non-negative integer")
        if self.max_bytes < 0 or self.max_disk_bytes < 0:
            raise ValueSetError(f"cache bounds must be non-negative, got {max_bytes} and {max_disk_bytes}")
        # a folder others could write into is not used (its files would be loaded): one warning
        self.directory = storage.trusted_directory(Path(directory))[0] if directory is not None else None
        self._entries: BoundedLRU[Hashable, Any] = BoundedLRU(self.max_bytes)  # by the entries' bytes
        self._aliases: BoundedLRU[tuple[str, str], str] = BoundedLRU(_ALIASES)
        self._pending: dict[Hashable, threading.Event] = {}
        self._lock = threading.Lock()
        self._counts = {"hits": 0, "misses": 0, "not_kept": 0, "disk_hits": 0, "disk_writes": 0}
        self._compile_seconds = 0.0

    # ------------------------------------------------------------------ sets

    def set_key(self, compiler: Compiler, values: Sequence[str] | Sequence[bytes]) -> str:
        """The set fingerprint of ``values`` (see :func:`values_fingerprint`), remembered by
        their exact order so that a request repeated as is costs one hash, not a sort."""
        exact = _exact_key(values)
        if exact is not None:
            with self._lock:
                known = self._aliases.get((compiler.vocab.fingerprint, exact))
                if known is not None:
                    return known
        fingerprint = values_fingerprint(values)
        if exact is not None:
            with self._lock:
                self._aliases.put((compiler.vocab.fingerprint, exact), fingerprint)
        return fingerprint

    def compile(
        self,
        compiler: Compiler,
        values: Iterable[str] | Iterable[bytes],
        *,
        eos: bool = True,
        layout: str = "trie",
        max_bytes: int | None = None,
    ) -> TrieAutomaton:
        """``compiler.compile(values, eos=eos, layout=layout)``, or the automaton compiled
        earlier for the same set (in memory, else on disk); errors are the compiler's."""
        if not isinstance(compiler, Compiler):
            raise ArgumentTypeError(
                f"CompileCache.compile needs a triemask.Compiler, got {type(compiler).__qualname__}"
            )
        items: Any = values if isinstance(values, list | tuple) else list(values)
        try:
            fingerprint = self.set_key(compiler, items)
        except ValueSetError:
            return compiler.compile(items, eos=eos, layout=layout, max_bytes=max_bytes)  # raises the typed error
        key = ("set", compiler.vocab.fingerprint, fingerprint, bool(eos), layout)

        def build() -> TrieAutomaton:
            found = self._from_disk(
                key,
                lambda path: TrieAutomaton.load(path, vocab=compiler.vocab),
                lambda automaton: automaton.set_fingerprint == fingerprint and automaton.eos == bool(eos),
            )
            if found is not None:
                return found
            automaton = compiler.compile(items, eos=eos, layout=layout, max_bytes=max_bytes)
            self._to_disk(key, automaton)
            return automaton

        return self.get(key, build, lambda automaton: automaton.memory_bytes)

    def compile_schema(self, compiler: Compiler, schema: Any, *, tools: bool = False, **options: Any) -> CompiledSchema:
        """``compiler.compile_json_schema(schema, **options)`` (``compiler.compile_tools(schema,
        **options)`` with ``tools=True``), or the one compiled earlier from equal JSON with equal
        options (in memory, else on disk). A schema that is not plain JSON (a pydantic model
        class) is compiled each time; errors are the compiler's."""
        if not isinstance(compiler, Compiler):
            raise ArgumentTypeError(
                f"CompileCache.compile_schema needs a triemask.Compiler, got {type(compiler).__qualname__}"
            )

        def compiled() -> CompiledSchema:
            if tools:
                return compiler.compile_tools(schema, **options)
            return compiler.compile_json_schema(schema, **options)

        try:
            given = json.loads(schema) if isinstance(schema, str) else schema
            text = json.dumps(given)  # key order kept: the properties are emitted in it
            settings = json.dumps(options, sort_keys=True)
        except (TypeError, ValueError):  # a pydantic class, or text that is not JSON: compiled (and checked) as is
            return compiled()
        key = ("tools" if tools else "schema", compiler.vocab.fingerprint, text, settings)

        def build() -> CompiledSchema:
            found = self._from_disk(
                key,
                lambda path: CompiledSchema.load(path, vocab=compiler),
                # a file answers only for what it was compiled from (never another schema's file
                # under this one's name), and only of the kind asked for
                lambda loaded: isinstance(loaded, CompiledTools) == tools and loaded.compiled_from(given, **options),
            )
            if found is not None:
                return found
            built = compiled()
            self._to_disk(key, built)
            return built

        return self.get(key, build, lambda entry: entry.memory_bytes)

    # ------------------------------------------------------------------ any entry

    def get(self, key: Hashable, build: Callable[[], _T], size: Callable[[_T], int]) -> _T:
        """The entry under ``key``, built by ``build()`` on a miss (once, however many threads
        ask at the same time) and kept when ``size(entry)`` fits the bound."""
        while True:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None:
                    self._counts["hits"] += 1
                    found: _T = entry
                    return found
                waiting = self._pending.get(key)
                if waiting is None:
                    self._pending[key] = threading.Event()
                    self._counts["misses"] += 1
                    break
            waiting.wait()  # another thread builds it; then look again (it may not have been kept)
            with self._lock:
                if key not in self._entries and key not in self._pending:
                    self._pending[key] = threading.Event()
                    self._counts["misses"] += 1
                    break
        try:
            started = time.perf_counter()
            built = build()
            nbytes = int(size(built))
            with self._lock:
                self._compile_seconds += time.perf_counter() - started
                if not self._entries.put(key, built, nbytes):
                    self._counts["not_kept"] += 1
            return built
        finally:
            with self._lock:
                self._pending.pop(key).set()

    # ------------------------------------------------------------------ disk

    def _path(self, key: tuple[Any, ...]) -> Path | None:
        if self.directory is None:
            return None
        name = hashlib.blake2b(repr(key).encode(), digest_size=16).hexdigest()
        return self.directory / f"{key[0]}-{name}.tm"  # set-, schema- or tools-

    def _from_disk(
        self, key: tuple[Any, ...], load: Callable[[Path], _T], fits: Callable[[_T], bool] = lambda _: True
    ) -> _T | None:
        """The entry the disk tier holds for ``key`` (``load``-ed, and ``fits`` it), else None:
        a missing, corrupt or foreign file is compiled again (and replaced)."""
        path = self._path(key)
        if path is None or not path.exists():
            return None
        try:
            found = load(path)
        except (AutomatonFileError, ImportError):  # ImportError: a schema without xgrammar
            return None
        if not fits(found):
            return None
        with self._lock:
            self._counts["disk_hits"] += 1
        return found

    def _to_disk(self, key: tuple[Any, ...], compiled: TrieAutomaton | CompiledSchema) -> None:
        path = self._path(key)
        if path is None or compiled.memory_bytes > self.max_disk_bytes:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            compiled.save(path)
            self._trim_disk()
        except OSError:  # a full or read-only disk: the memory tier still works
            return
        with self._lock:
            self._counts["disk_writes"] += 1

    def _trim_disk(self) -> None:
        if self.directory is None:
            return
        files = sorted(self._files(), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in files)
        for oldest in files:
            if total <= self.max_disk_bytes:
                break
            total -= oldest.stat().st_size
            oldest.unlink(missing_ok=True)

    def _files(self) -> list[Path]:
        if self.directory is None:
            return []
        return [p for prefix in ("set", "schema", "tools") for p in self.directory.glob(f"{prefix}-*.tm")]

    # ------------------------------------------------------------------ description

    def stats(self) -> dict[str, Any]:
        """``entries``, ``bytes`` (and ``max_bytes``), ``hits``, ``misses``, ``evictions``,
        ``not_kept`` (entries larger than the bound), ``disk_hits``, ``disk_writes``,
        ``compile_seconds`` (spent building entries), and the disk tier's ``directory``."""
        with self._lock:
            return {
                "entries": len(self._entries),
                "bytes": self._entries.used,
                "max_bytes": self.max_bytes,
                "evictions": self._entries.evictions,
                **self._counts,
                "compile_seconds": self._compile_seconds,
                "directory": None if self.directory is None else str(self.directory),
            }

    def clear(self, *, disk: bool = False) -> None:
        """Drop every entry in memory (and the disk tier's files with ``disk=True``)."""
        with self._lock:
            self._entries.clear()
            self._aliases.clear()
        if disk and self.directory is not None:
            for path in self._files():
                path.unlink(missing_ok=True)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        stats = self.stats()
        return f"CompileCache(entries={stats['entries']}, bytes={stats['bytes']}, max_bytes={stats['max_bytes']})"


_DEFAULT: CompileCache | None = None
_DEFAULT_LOCK = threading.Lock()


def default_compile_cache() -> CompileCache:
    """The process's shared cache (memory only, ``$TRIEMASK_CACHE_BYTES``), made on first use;
    the adapters compile through it."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = CompileCache()
        return _DEFAULT
