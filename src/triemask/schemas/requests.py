"""What an OpenAI chat request constrains: ``response_format``, ``tools`` and ``tool_choice``
read into the schema or tool list that triemask compiles.

The fields are read as the serving engines read them (vLLM 0.32, ``vllm/entrypoints/openai``;
SGLang ``serving_chat``), except that a required tool list stays a tool list where they build
one union schema of it, and ``json_object`` is OpenAI's definition (any object):

=====================================================  =============================================
request                                                constraint
=====================================================  =============================================
``response_format={"type": "json_schema",``            the schema, as given
``"json_schema": {"schema": S, ...}}``
``response_format={"type": "json_object"}``            ``{"type": "object"}``: any JSON object
``response_format={"type": "text"}`` or none           nothing
``tools=[...], tool_choice="required"``                the tool list: one call ``{"name": <a tool>,
                                                       "arguments": <its parameters>}``
                                                       (:meth:`Compiler.compile_tools`)
``tools=[...], tool_choice={"type": "function",``      that tool's parameters schema: the output is
``"function": {"name": N}}``                           its arguments, as the engines do
``tool_choice="auto"``, ``"none"`` or none             nothing: the model may answer in text
=====================================================  =============================================

A request that asks for two constraints at once (a ``json_schema`` and a required or named
tool) is refused rather than one of them silently dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..base import SchemaError
from .tools import read_tools

_ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class RequestConstraint:
    """The constraint of one request: a JSON ``schema`` to compile with
    :meth:`Compiler.compile_json_schema`, or ``tools`` (OpenAI function specs) to compile
    with :meth:`Compiler.compile_tools`; exactly one of the two is set."""

    schema: Any = None
    tools: list[Any] | None = None


def constraint_of_request(
    *, response_format: Any = None, tools: Any = None, tool_choice: Any = None
) -> RequestConstraint | None:
    """The :class:`RequestConstraint` of an OpenAI chat request's fields, or None where they
    leave the answer free (no ``response_format`` or a ``text`` one, and no tool required).

    Raises
    ------
    SchemaError
        A field of the wrong shape, a named tool that is not in ``tools``, a tool choice
        without tools, or both a ``json_schema`` and a required or named tool; ``.path``
        names the field (``"$.tool_choice.function.name"``).
    """
    from_tools = _from_tools(tools, tool_choice)
    from_format = _from_response_format(response_format)
    if from_tools is not None and from_format is not None:
        raise SchemaError(
            f"the request asks for both a response_format ({response_format.get('type')!r}) and "
            f"tool_choice={tool_choice!r:.80}: one constraint at a time (drop one of them)",
            path="$.response_format",
        )
    return from_tools if from_tools is not None else from_format


def _from_response_format(response_format: Any) -> RequestConstraint | None:
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise SchemaError(
            f"response_format must be an object, got {type(response_format).__name__}", path="$.response_format"
        )
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return RequestConstraint(schema=dict(_ANY_OBJECT))
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping):
            raise SchemaError(
                f"response_format.json_schema must be an object, got {type(spec).__name__}",
                path="$.response_format.json_schema",
            )
        schema = spec.get("schema")
        if not isinstance(schema, Mapping):
            raise SchemaError(
                f"response_format.json_schema.schema must be a JSON schema object, got {type(schema).__name__}",
                path="$.response_format.json_schema.schema",
            )
        return RequestConstraint(schema=dict(schema))
    raise SchemaError(
        f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r:.60}",
        path="$.response_format.type",
    )


def _from_tools(tools: Any, tool_choice: Any) -> RequestConstraint | None:
    if tool_choice is None or tool_choice in ("auto", "none"):
        return None
    if tools is None:
        raise SchemaError(f"tool_choice={tool_choice!r:.80} needs tools", path="$.tool_choice")
    try:  # (checked here, so that an error names the request's field)
        read = read_tools(tools)
    except SchemaError as exc:
        raise SchemaError(f"tools: {exc}", path="$.tools" + exc.path.removeprefix("$")) from None
    if tool_choice == "required":
        return RequestConstraint(tools=list(tools))
    name = _named_tool(tool_choice)
    for tool_name, parameters in read:
        if tool_name == name:
            return RequestConstraint(schema=parameters)
    raise SchemaError(f"tool_choice names {name!r}, which is not one of the tools", path="$.tool_choice.function.name")


def _named_tool(tool_choice: Any) -> str:
    """The name in ``{"type": "function", "function": {"name": N}}``."""
    if not isinstance(tool_choice, Mapping):
        raise SchemaError(
            f"tool_choice must be 'auto', 'none', 'required' or a named function, got {tool_choice!r:.80}",
            path="$.tool_choice",
        )
    if tool_choice.get("type", "function") != "function":
        raise SchemaError(
            f"tool_choice.type must be 'function', got {tool_choice.get('type')!r:.60}", path="$.tool_choice.type"
        )
    function = tool_choice.get("function")
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str) or not name:
        raise SchemaError(
            f"tool_choice.function.name must be a non-empty string, got {name!r:.60}",
            path="$.tool_choice.function.name",
        )
    return name
