"""The public compiler: sets, patterns and formats (:class:`~triemask.sets.SetCompiler`),
JSON schemas and tool lists (:mod:`triemask.schemas`) and incremental updates, for one vocabulary."""

from __future__ import annotations

from typing import Any

from .schemas import DEFAULT_TOOL_CACHE_BYTES, CompiledSchema, CompiledTools, SchemaOptions
from .sets import SetCompiler

__all__ = ["Compiler"]


class Compiler(SetCompiler):
    """Compiles sets of values, patterns, formats, JSON schemas and tool lists against one
    vocabulary (everything :class:`~triemask.sets.SetCompiler` does, and the schema entry points).

    Building a compiler indexes the vocabulary once (about 70 ms for a 150K-token
    vocabulary with the C extension) and keeps the index on disk, named by the
    vocabulary's fingerprint, so that later processes load it instead; every
    :meth:`compile` reuses that index. A compiler holds no per-set state and may be
    shared between threads.

    Parameters
    ----------
    vocab : Vocabulary
        The vocabulary of the model that will be constrained.
    disk_cache : bool
        Load the index from, and save it to, ``cache_dir`` (default True). A cached file
        that fails any check is rebuilt; a folder that cannot be written is skipped
        (``stats()["source"]`` says which happened).
    cache_dir : str or path, optional
        Default ``$TRIEMASK_CACHE``, else ``~/.cache/triemask``.

    Examples
    --------
    >>> from triemask import Compiler, Vocabulary
    >>> vocab = Vocabulary([b"a", b"b", b"ab", None], eos_token_ids=3)
    >>> automaton = Compiler(vocab).compile(["ab", "b"])
    >>> automaton.allowed_token_ids(automaton.initial_state).tolist()
    [0, 1, 2]
    """

    __slots__ = ()

    def compile_json_schema(
        self,
        schema: Any,
        *,
        any_whitespace: bool = True,
        indent: int | None = None,
        separators: tuple[str, str] | None = None,
        strict_mode: bool = True,
        min_enum_values: int | None = None,
        unsupported: str | None = None,
        min_union_branches: int | None = None,
    ) -> CompiledSchema:
        """Compile a JSON schema: enum fields to tries, the structure to xgrammar.

        Parameters
        ----------
        schema : dict, str or pydantic model class
            The JSON schema (never modified).
        any_whitespace, indent, separators, strict_mode
            As in xgrammar's ``GrammarCompiler.compile_json_schema``: the language
            is the one xgrammar compiles from ``schema`` with these options, kept to
            strict JSON (RFC 8259: no raw control character or invalid UTF-8 inside a
            string, which xgrammar's length-bounded strings admit; ``separators`` a
            comma and a colon with optional whitespace).
        min_enum_values : int, optional
            Enums (and ``anyOf`` / ``oneOf`` of consts) with at least this many
            distinct values go to a trie; smaller ones stay in xgrammar. Default
            :data:`triemask.DEFAULT_MIN_ENUM_VALUES`.
        min_union_branches : int, optional
            Discriminated unions (an ``anyOf`` / ``oneOf`` of objects whose first property,
            required, is a distinct string in each: tool calls, ``{"type": ...}`` events,
            pydantic discriminated unions) with at least this many branches go to a trie of
            the discriminator, each branch compiled when first chosen (docs/schemas.md);
            smaller ones stay in xgrammar. Default 128.
        unsupported : {"warn", "error", "ignore"}, optional
            What a keyword xgrammar accepts but does not enforce (``not``,
            ``if``/``then``/``else``, ``uniqueItems``, ``contains``, ...) gets: the schema is
            compiled as xgrammar compiles it, with one
            :class:`~triemask.UnenforcedSchemaWarning` ("warn", the default), or without
            one ("ignore"); "error" refuses it. ``CompiledSchema.unenforced`` lists them.

        Raises
        ------
        SchemaError
            The schema is not JSON, has an empty enum, a value no token can spell,
            something xgrammar rejects, or (``unsupported="error"``) a keyword it does not
            enforce; ``.path`` names the field.
        ImportError
            xgrammar is not installed (``pip install 'triemask[schema]'``).
        """
        options = SchemaOptions.given(_keywords(locals()))
        return CompiledSchema(self, schema, options)

    def compile_tools(
        self,
        tools: Any,
        *,
        any_whitespace: bool = True,
        indent: int | None = None,
        separators: tuple[str, str] | None = None,
        strict_mode: bool = True,
        min_enum_values: int | None = None,
        unsupported: str | None = None,
        min_union_branches: int | None = None,
        cache_bytes: int | None = None,
    ) -> CompiledTools:
        """Compile a tool list: the output is ``{"name": <a tool>, "arguments": <its parameters>}``.

        The language is that of ``{"anyOf": [{"type": "object", "properties": {"name":
        {"const": name_i}, "arguments": parameters_i}, "required": ["name", "arguments"]},
        ...]}`` compiled with the same options, but nothing per tool is compiled up front:
        the name is a trie, and a tool's arguments are compiled when it is chosen.

        Parameters
        ----------
        tools : list of dict
            OpenAI-style function specs: ``{"name", "description", "parameters"}`` or
            ``{"type": "function", "function": {...}}``.
        any_whitespace, indent, separators, strict_mode, min_enum_values, unsupported, min_union_branches
            As in :meth:`compile_json_schema`, for every tool's arguments (each is
            compiled, and reports what xgrammar does not enforce, when first chosen).
        cache_bytes : int, optional
            Bound on the compiled argument schemas kept (default 256 MiB).

        Raises
        ------
        SchemaError
            An empty list, a spec without a name, a name given twice (``.path`` names
            it, e.g. ``$[3].function.name``); a tool's bad parameters when that tool
            is first compiled.
        """
        options = SchemaOptions.given(_keywords(locals()))
        return CompiledTools(
            self, tools, options, cache_bytes=DEFAULT_TOOL_CACHE_BYTES if cache_bytes is None else cache_bytes
        )


def _keywords(arguments: dict[str, Any]) -> dict[str, Any]:
    """A schema entry point's options from its ``locals()`` (those of :class:`SchemaOptions`)."""
    return {name: arguments[name] for name in SchemaOptions.__dataclass_fields__}
