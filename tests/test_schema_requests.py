"""OpenAI request fields read into what triemask compiles (``schemas.constraint_of_request``)."""

from __future__ import annotations

from typing import Any

import pytest

from triemask import ArgumentTypeError, SchemaError
from triemask.schemas import RequestConstraint, constraint_of_request

SCHEMA = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"]}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get", "parameters": {"type": "object", "properties": {}}}},
    {"name": "put", "parameters": SCHEMA},
]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, None),
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}}, RequestConstraint(schema={"type": "object"})),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "n", "schema": SCHEMA, "strict": True},
                }
            },
            RequestConstraint(schema=SCHEMA),
        ),
        ({"tools": TOOLS}, None),
        ({"tools": TOOLS, "tool_choice": "auto"}, None),
        (
            {"tools": TOOLS, "tool_choice": "none", "response_format": {"type": "json_object"}},
            RequestConstraint(schema={"type": "object"}),
        ),
        ({"tools": TOOLS, "tool_choice": "required"}, RequestConstraint(tools=TOOLS)),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "put"}}},
            RequestConstraint(schema=SCHEMA),
        ),
        (
            {"tools": TOOLS, "tool_choice": {"function": {"name": "get"}}},
            RequestConstraint(schema={"type": "object", "properties": {}}),
        ),
    ],
)
def test_request_fields_read_as_the_engines_read_them(
    fields: dict[str, Any], expected: RequestConstraint | None
) -> None:
    assert constraint_of_request(**fields) == expected


def test_a_named_tool_without_parameters_allows_an_empty_object() -> None:
    found = constraint_of_request(
        tools=[{"name": "ping"}], tool_choice={"type": "function", "function": {"name": "ping"}}
    )
    assert found is not None and found.schema == {"type": "object", "properties": {}}


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"response_format": "json"}, "$.response_format"),
        ({"response_format": {"type": "xml"}}, "$.response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "$.response_format.json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "n"}}},
            "$.response_format.json_schema.schema",
        ),
        ({"tool_choice": "required"}, "$.tool_choice"),
        ({"tools": TOOLS, "tool_choice": "always"}, "$.tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "code", "function": {"name": "get"}}}, "$.tool_choice.type"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {}}}, "$.tool_choice.function.name"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "gone"}}},
            "$.tool_choice.function.name",
        ),
        ({"tools": [{"name": "a"}, {"name": "a"}], "tool_choice": "required"}, "$.tools[1].name"),
        ({"tools": [{"function": {"name": ""}}], "tool_choice": "required"}, "$.tools[0].function.name"),
        (
            {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "$.response_format",
        ),
    ],
)
def test_malformed_request_fields_name_the_field(fields: dict[str, Any], path: str) -> None:
    with pytest.raises(SchemaError) as caught:
        constraint_of_request(**fields)
    assert caught.value.path == path, caught.value


def test_tools_that_are_no_list_are_a_type_error() -> None:
    with pytest.raises(ArgumentTypeError, match="list of function specs"):
        constraint_of_request(tools="get", tool_choice="required")
