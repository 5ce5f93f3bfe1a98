"""Tool calls: the tool name in a trie, each tool's arguments compiled when it is chosen.

The output is one JSON object ``{"name": <tool name>, "arguments": <that tool's
parameters>}``: the language of the ``anyOf`` over one object per tool, compiled
with the same options. Compiling that ``anyOf`` up front costs seconds for a
large registry; here the name is a trie, and when a name is complete the matcher
switches to the chosen tool's own schema, ``{"name": "", "arguments": parameters}``,
fed the output so far with the name replaced by ``""`` (the text before the name
is the same in every tool's grammar). Argument schemas are compiled on first use
(or by :meth:`CompiledTools.warm`), shared by tools with equal parameters, and kept
in a byte-bounded cache shared by every request.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from ..base import ArgumentTypeError, AutomatonFileError, BoundedLRU, SchemaError, integer, register_kind
from ..sets import SetCompiler
from ..vocab import Vocabulary
from .compiled import CompiledSchema
from .fields import SchemaOptions
from .reading import json_texts
from .structure import Configuration

DEFAULT_TOOL_CACHE_BYTES = 256 << 20
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def read_tools(tools: Any) -> list[tuple[str, dict[str, Any]]]:
    """``(name, parameters schema)`` per tool, from OpenAI-style function specs.

    Raises
    ------
    SchemaError
        A spec without a usable name or parameters, or a name given twice;
        ``.path`` names it (``$[3].function.name``).
    """
    if isinstance(tools, str | bytes | dict) or not isinstance(tools, Iterable):
        raise ArgumentTypeError(f"tools must be a list of function specs, got {type(tools).__name__}")
    read: list[tuple[str, dict[str, Any]]] = []
    seen: dict[str, int] = {}
    for i, spec in enumerate(tools):
        path = f"$[{i}]"
        if not isinstance(spec, dict):
            raise SchemaError(f"{path} must be an object (a function spec), got {type(spec).__name__}", path=path)
        if "function" in spec:
            if spec.get("type", "function") != "function":
                raise SchemaError(f"{path}.type must be 'function', got {spec.get('type')!r}", path=f"{path}.type")
            spec, path = spec["function"], f"{path}.function"
            if not isinstance(spec, dict):
                raise SchemaError(f"{path} must be an object, got {type(spec).__name__}", path=path)
        name = spec.get("name")
        if not isinstance(name, str) or not name:
            raise SchemaError(f"{path}.name must be a non-empty string, got {name!r:.60}", path=f"{path}.name")
        if name in seen:
            raise SchemaError(
                f"{path}.name {name!r} is also the name of tool {seen[name]}: tool names must be distinct",
                path=f"{path}.name",
            )
        seen[name] = i
        parameters = spec.get("parameters", _EMPTY_PARAMETERS)
        if not isinstance(parameters, dict):
            raise SchemaError(
                f"{path}.parameters must be a JSON schema object, got {type(parameters).__name__}",
                path=f"{path}.parameters",
            )
        read.append((name, parameters))
    if not read:
        raise SchemaError("the tool list is empty: no call could ever be generated", path="$")
    return read


class CompiledTools(CompiledSchema):
    """A tool list compiled for one vocabulary (:meth:`Compiler.compile_tools`).

    Immutable from the outside and shareable across threads and requests; the
    argument schemas it compiles on demand live in a byte-bounded, thread-safe cache.
    """

    def __init__(
        self,
        compiler: SetCompiler,
        tools: Any,
        options: SchemaOptions = SchemaOptions(),  # noqa: B008 (immutable)
        *,
        cache_bytes: int = DEFAULT_TOOL_CACHE_BYTES,
    ) -> None:
        started = time.perf_counter()
        self._tools = read_tools(tools)
        names = [name for name, _ in self._tools]
        # Only the text up to the end of the name is ever decoded with this grammar (then
        # the chosen tool's own grammar takes over), so "arguments" gets the cheapest schema.
        shape = {
            "type": "object",
            "properties": {"name": {"enum": names}, "arguments": {"type": "null"}},
            "required": ["name", "arguments"],
        }
        try:
            # the name is always a trie, whatever the number of tools
            super().__init__(compiler, shape, replace(options, min_enum_values=1))
        except SchemaError as exc:  # a name no token spells: name the tool, not the internal schema
            found = re.fullmatch(r"\$\.properties\.name\.enum\[(\d+)\]", exc.path)
            path = f"$[{found.group(1)}].name" if found else "$"
            raise SchemaError(f"{path}: {exc}", path=path) from None
        self._tools_ready(compiler, options, cache_bytes)
        self._compile_seconds = time.perf_counter() - started

    def _tools_ready(self, compiler: SetCompiler, options: SchemaOptions, cache_bytes: int) -> None:
        """The tools' state besides the name's schema (compiled or loaded alike)."""
        self._compiler = compiler
        self._options = options  # the tools' arguments' (the name was compiled with min_enum_values=1)
        self._by_text = {text: i for i, text in enumerate(json_texts(tuple(self.tool_names), "$"))}
        self._arguments: BoundedLRU[str, CompiledSchema] = BoundedLRU(cache_bytes)  # by memory_bytes
        self._lock = threading.Lock()
        self._compile_seconds = 0.0  # the argument schemas' compiles

    # ------------------------------------------------------------------ files

    _kind = "tools"

    def _described(self) -> Any:
        return [{"name": name, "parameters": parameters} for name, parameters in self._tools]

    @classmethod
    def _described_for(cls, given: Any) -> Any:
        return [{"name": name, "parameters": parameters} for name, parameters in read_tools(given)]

    def _file_options(self) -> dict[str, Any]:
        return {**super()._file_options(), "cache_bytes": self._arguments.limit}

    @classmethod
    def _file_options_given(cls, options: dict[str, Any]) -> dict[str, Any]:
        given = dict(options)
        cache_bytes = given.pop("cache_bytes", None)
        return {
            **SchemaOptions.given(given).to_file(),
            "cache_bytes": DEFAULT_TOOL_CACHE_BYTES if cache_bytes is None else cache_bytes,
        }

    def _restore_described(
        self, described: Any, meta: dict[str, Any], vocab: Vocabulary, compiler: SetCompiler | None
    ) -> None:
        self._schema = {}  # the name's internal schema: not what the user gave
        self._unenforced = ()  # (the tools' arguments report theirs when compiled)
        self._tools = read_tools(described)
        options = meta["options"]
        self._tools_ready(
            compiler if compiler is not None else SetCompiler(vocab),
            self._options,
            integer(options["cache_bytes"], "cache_bytes"),
        )
        if len(self._fields) != 1 or set(self._by_text) != set(self._fields[0].automaton.values()):
            raise AutomatonFileError("the stored tool names and the name's automaton disagree", field="described")

    @property
    def tool_names(self) -> list[str]:
        return [name for name, _ in self._tools]

    def arguments_schema(self, name_or_index: str | int) -> CompiledSchema:
        """The compiled schema of one tool's call (its name ``""``, its arguments),
        compiled now unless cached."""
        if isinstance(name_or_index, str):
            index = next((i for i, (n, _) in enumerate(self._tools) if n == name_or_index), None)
            if index is None:
                raise SchemaError(f"no tool is named {name_or_index!r}", path="$")
        else:
            index = integer(name_or_index, "a tool index", SchemaError, "a tool name or index")
            if not 0 <= index < len(self._tools):
                raise SchemaError(f"tool index {index} is outside [0, {len(self._tools)})", path="$")
        parameters = self._tools[index][1]
        key = json.dumps(parameters)  # key order kept: the arguments are emitted in it
        with self._lock:  # one compile at a time: equal schemas are compiled once
            cached = self._arguments.get(key)
            if cached is not None:
                return cached
            started = time.perf_counter()
            try:
                found = CompiledSchema(
                    self._compiler,
                    {
                        "type": "object",
                        "properties": {"name": {"const": ""}, "arguments": parameters},
                        "required": ["name", "arguments"],
                    },
                    self._options,
                )
            except SchemaError as exc:
                path = f"$[{index}].parameters" + exc.path.removeprefix("$.properties.arguments")
                raise SchemaError(f"tool {self._tools[index][0]!r}: {exc}", path=path) from None
            self._compile_seconds += time.perf_counter() - started
            self._arguments.put(key, found, found.memory_bytes)
            return found

    def warm(self, names: Sequence[str] | None = None) -> None:
        """Compile the argument schemas of ``names`` (default: every tool) now, e.g.
        in a background thread, so that no request waits for one."""
        for i, (name, _) in enumerate(self._tools):
            if names is None or name in names:
                self.arguments_schema(i)

    @property
    def memory_bytes(self) -> int:
        """The name trie and structure, plus the argument schemas cached so far."""
        with self._lock:
            cached = self._arguments.used
        return super().memory_bytes + cached

    def stats(self) -> dict[str, Any]:
        found = super().stats()
        with self._lock:
            found["tools"] = {
                "count": len(self._tools),
                "argument_schemas_cached": len(self._arguments),
                "argument_cache_bytes": self._arguments.used,
                "argument_cache_limit": self._arguments.limit,
                "hits": self._arguments.hits,
                "misses": self._arguments.misses,
                "evictions": self._arguments.evictions,
                "compile_seconds": self._compile_seconds,
            }
        return found

    def _switches(self, k: int) -> bool:
        return True

    def _exit(self, matcher: Any, k: int, node: int, value_start: bytes) -> list[Configuration]:
        text = self._fields[k].automaton.value_of(node)
        assert isinstance(text, bytes)
        arguments = self.arguments_schema(self._by_text[text])

        # the chosen tool's own grammar takes over, from its start, after the text so far
        # (the call's name an empty string in it: {"name": "", "arguments": ...})
        def read(after: bytes) -> list[Configuration]:
            (start,) = arguments._initial()
            return arguments._feed(start.matcher, after, b"")

        return arguments._kept_after(bytes(value_start) + b'""', read)

    def __repr__(self) -> str:
        return f"CompiledTools({len(self._tools)} tools, vocab_size={self.vocab_size})"


register_kind("tools", CompiledTools)
