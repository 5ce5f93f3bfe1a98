"""Reading a JSON schema and finding the enum fields that go to tries.

A JSON schema is taken as a dict, a JSON string or a pydantic model class. Every
``enum`` of JSON scalars, and every ``anyOf`` / ``oneOf`` whose branches are all
``const`` scalars, with at least ``min_enum_values`` distinct values, is an *enum
site*: it is replaced by a ``const`` placeholder before the structure is handed to
xgrammar, and its values are compiled to a trie over their JSON text, spelled
exactly as xgrammar spells them (see :func:`json_texts`).

String fields of a finite language are sites too: ``{"type": "string", "format": F}``
for the formats whose language is finite and equal to xgrammar's (date, uuid, ipv4,
ipv6) and ``{"type": "string", "pattern": P}`` for a finite ``P`` whose strings need
no JSON escape; they compile to the pattern's minimal acyclic automaton (with the
quotes) instead of a trie. ``time`` and ``date-time`` stay in xgrammar, whose
language for them is infinite (any number of fraction digits), and so does any
string with other constraints (``minLength``...) or an infinite pattern.

Sites are found wherever they are: object properties, array items, ``$defs``,
``anyOf`` branches, and so on, except where a schema describes property names
(``propertyNames`` and what it references): a site's sentinel stands for a value, never a
key. Paths name them in JSONPath style (``$.properties.name.enum[3]``), and every error
names the path it is about. What one schema may cost is bounded before any engine sees it:
its depth (:data:`MAX_SCHEMA_DEPTH`) and the ``pattern`` automata it builds
(:data:`MAX_DISPATCHED_PATTERNS`).
"""

from __future__ import annotations

import json
import math
import re
import secrets
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import numpy as np

from ..base import ArgumentTypeError, PatternError, SchemaError, kernels
from ..sets import FORMATS, dag_of_pattern

TOO_DEEP = "the schema is nested too deeply"  # how every refusal of a deep schema begins
MAX_SCHEMA_DEPTH = 128
"""How deeply a schema's JSON may nest (about 60 nested objects): the structural engine's
compile grows faster than the depth (xgrammar: 0.04 s at 128 levels, 0.24 s at 243), and
real schemas nest a few levels, reusing definitions through ``$ref``."""
MAX_DISPATCHED_PATTERNS = 8
"""``pattern`` fields of one schema whose automaton is built (each bounded, about 0.06 s at
most): further ones, and patterns over 4,096 characters, stay with the structural engine."""
_MAX_DISPATCHED_PATTERN_CHARS = 4096
MAX_CHOICE_COMPILE_MS = 500
"""The most a discriminated union's choice may cost xgrammar's compile, estimated
(:func:`dispatched_cost`): a choice is compiled while decoding, inside a serving engine's step,
so a union whose structure and costliest branch are priced above this stays xgrammar's
(compiled ahead, with the rest of the structure). Real tool registries' choices take 10-60 ms."""


# Keywords whose value is one subschema, a list of them, or a name -> subschema map.
_ONE = (
    "items",
    "additionalProperties",
    "additionalItems",
    "unevaluatedProperties",
    "unevaluatedItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
)
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_CHILDREN = frozenset(_ONE + _LIST + _MAP)  # the keywords holding subschemas
_ONE_KEYWORDS, _LIST_KEYWORDS, _MAP_KEYWORDS = frozenset(_ONE), frozenset(_LIST), frozenset(_MAP)
# Keywords xgrammar accepts but does not enforce (with the value that is a no-op): the output
# may break them, so they are reported (SchemaOptions.unsupported), and no enum below one goes
# to a trie (xgrammar's grammar has no place for it).
_UNENFORCED = {
    "not": None,
    "if": None,
    "then": None,
    "else": None,
    "uniqueItems": False,
    "contains": None,
    "minContains": None,
    "maxContains": None,
    "dependentRequired": None,
    "dependentSchemas": None,
    "dependencies": None,
    "unevaluatedProperties": True,
    "unevaluatedItems": True,
    "$dynamicRef": None,
    "$recursiveRef": None,
}
XGRAMMAR_ANNOTATIONS = (
    "title",
    "description",
    "examples",
    "default",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$comment",
    "$schema",
)
"""The keywords xgrammar's JSON schema converter takes for annotations and never reads (its
``IsSchemaAnnotationKey``); tests/test_schemas.py checks its grammar is the same without them."""
# (so a branch {"const": x, "description": ...} is still a plain const)
_ANNOTATIONS = frozenset(XGRAMMAR_ANNOTATIONS)
# Formats whose language here is exactly xgrammar's (time and date-time are not: see above).
DISPATCHED_FORMATS = ("date", "uuid", "ipv4", "ipv6")
_STRING_KEYS = frozenset({"type", "format", "pattern"})
# Bytes a JSON string holds only escaped; xgrammar matches a pattern on the raw string
# (json_string=true) and never allows them, so a pattern that can spell one stays there.
_ESCAPED_BYTES = np.array([*range(0x20), ord('"'), ord("\\"), 0x7F], dtype=np.uint8)
_UNESCAPED_BYTES = bytes(sorted(set(range(256)) - set(_ESCAPED_BYTES.tolist())))  # (json_texts)


Pointer = tuple[str | int, ...]
"""A place in a schema: the keys and list indices from its root."""


@dataclass(frozen=True)
class EnumSite:
    """One enum field of a schema: where it is and what it allows."""

    path: str
    values: tuple[Any, ...]  # the JSON values, as given, duplicates removed (empty for a pattern)
    placeholder: str  # the const string that stands for it in the structural schema
    pattern: str | None = None  # a finite string field: the regex of its content (no quotes)
    union: UnionChoice | None = None  # a discriminated union: the values are its discriminator's
    at: Pointer = ()  # where it is


@dataclass(frozen=True)
class UnionChoice:
    """A discriminated union (see :func:`union_values`) that is a site: its branches are told
    apart by the value of property ``key``, the first each branch emits, and the site's values
    are those, in branch order.

    ``pointer`` locates it in the schema (keys and list indices from the root): the union
    itself, which occurs at most once in any instance (``repeated`` False), or the array whose
    ``items`` it is (``repeated`` True: each element after the array's ``prefixItems`` chooses
    anew). A choice compiles the schema with the union replaced by the chosen branch, or with
    the branch appended to the array's ``prefixItems`` (and ``items`` false where ``maxItems``
    allows no element after it): the language of the union for that discriminator value,
    exactly."""

    pointer: Pointer
    key: str
    keyword: str  # "anyOf" or "oneOf"
    repeated: bool

    def branches(self, schema: dict[str, Any]) -> list[Any]:
        """The union's branches in ``schema`` (the one it was found in)."""
        node = _at(schema, self.pointer)
        if self.repeated:
            node = node["items"]
        branches: list[Any] = node[self.keyword]
        return branches

    def chosen(self, schema: dict[str, Any], branch: int) -> dict[str, Any]:
        """``schema`` where the union has chosen ``branch``: the containers on the way to the
        change are copied, everything else is shared with ``schema`` (which is not modified;
        a compile copies what it is given)."""
        choice = self.branches(schema)[branch]
        if not self.pointer and not self.repeated:  # (the whole schema: its definitions stay)
            return {**choice, **{k: schema[k] for k in ("$defs", "definitions") if k in schema}}
        copied: dict[str, Any] = dict(schema)
        parent: Any = copied
        for step in self.pointer if self.repeated else self.pointer[:-1]:
            inner = parent[step]
            parent[step] = dict(inner) if isinstance(inner, dict) else list(inner)
            parent = parent[step]
        if self.repeated:  # (parent: the array)
            parent["prefixItems"] = [*parent.get("prefixItems", []), choice]
            bound = parent.get("maxItems")
            if type(bound) is int and bound <= len(parent["prefixItems"]):
                # no element can follow (vLLM's parallel_tool_calls=False): the union is out of
                # reach, so the choice has no trie field and compiles through xgrammar's caches
                parent["items"] = False
        else:
            parent[self.pointer[-1]] = choice
        return copied


def _at(node: Any, pointer: Pointer) -> Any:
    for step in pointer:
        node = node[step]
    return node


def load_schema(schema: Any) -> dict[str, Any]:
    """The schema as a fresh dict of plain dicts and lists (the caller's object is never
    modified): what ``json.loads(json.dumps(schema))`` gives, copied in C where the extension
    is built and the schema is plain (a 566 KB schema: 1 ms against 11 ms).

    Raises
    ------
    SchemaError
        A string that is not JSON, JSON that is not an object, or nesting deeper than
        :data:`MAX_SCHEMA_DEPTH`.
    ArgumentTypeError
        Anything but a dict, a str or a pydantic model class.
    """
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        schema = schema.model_json_schema()
    if isinstance(schema, str | bytes):
        try:
            loaded = json.loads(schema)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SchemaError(f"the schema is not valid JSON: {exc}", path="$") from None
        except RecursionError:
            raise SchemaError(f"{TOO_DEEP} (beyond Python's recursion limit)", path="$") from None
    elif isinstance(schema, Mapping):
        native = kernels.KERNELS
        loaded = native.json_copy(schema) if native is not None and type(schema) is dict else None
        try:  # (None: not plain; the round trip converts tuples and key types, or names what is not JSON)
            loaded = json.loads(json.dumps(schema, allow_nan=False)) if loaded is None else loaded
        except (TypeError, ValueError) as exc:
            raise SchemaError(f"the schema is not JSON-serialisable: {exc}", path="$") from None
        except RecursionError:
            raise SchemaError(f"{TOO_DEEP} (beyond Python's recursion limit)", path="$") from None
    else:
        raise ArgumentTypeError(
            f"schema must be a dict, a JSON string or a pydantic model class, got {type(schema).__name__}"
        )
    if not isinstance(loaded, dict):
        raise SchemaError(f"a JSON schema is an object, got {type(loaded).__name__} {loaded!r:.60}", path="$")
    depth = _depth(loaded)
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaError(
            f"{TOO_DEEP}: {depth} levels, more than {MAX_SCHEMA_DEPTH}; define repeated parts once in $defs "
            "and refer to them",
            path="$",
        )
    return loaded


def _depth(node: Any) -> int:
    """How deeply ``node``'s JSON nests (without recursion). In C where the extension is
    built (with :func:`_dicts_within`'s walk), else :func:`_depth_reference`."""
    native = kernels.KERNELS
    return int(native.json_containers(node)[1]) if native is not None else _depth_reference(node)


def _depth_reference(node: Any) -> int:
    """:func:`_depth` in Python: level by level, containers only."""
    depth, level = 0, [node] if type(node) in (dict, list) else []
    while level:
        depth += 1
        inner = []
        for item in level:
            inner += [child for child in (item.values() if type(item) is dict else item) if type(child) in (dict, list)]
        level = inner
    return depth


_IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")


def _key_path(path: str, key: str) -> str:
    return f"{path}.{key}" if _IDENTIFIER.fullmatch(key) else f"{path}[{json.dumps(key)}]"


def all_strings(values: Iterable[Any]) -> bool:
    """Whether every value is a ``str`` itself (no subclass): the common enum, checked with one
    pass in C (a generator over 3,000 values takes 0.3 ms, this 0.05)."""
    return set(map(type, values)) <= {str}


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | bool | int | float)


def _check_values(values: list[Any], path: str) -> None:
    if all_strings(values):
        try:
            "".join(values).encode("utf-8")
            return
        except UnicodeEncodeError:
            pass
    try:  # one encode for the common case
        "".join(value for value in values if type(value) is str).encode("utf-8")
        strings_ok = True
    except UnicodeEncodeError:
        strings_ok = False
    for i, value in enumerate(values):
        if isinstance(value, str) and not strings_ok:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise SchemaError(
                    f"{path}[{i}] {value!r:.60} is not valid Unicode ({exc.reason})", path=f"{path}[{i}]"
                ) from None
        elif isinstance(value, float) and not math.isfinite(value):
            raise SchemaError(f"{path}[{i}] is {value}, which JSON cannot spell", path=f"{path}[{i}]")


def _enum_values(node: dict[str, Any], path: str) -> tuple[list[Any], str] | None:
    """The values of an enum-like node and the path of its value list, else None."""
    if "enum" in node:
        values = node["enum"]
        where = f"{path}.enum"
        if not isinstance(values, list):
            raise SchemaError(f"{where} must be an array, got {type(values).__name__}", path=where)
        if not values:
            raise SchemaError(f"{where} is empty: no value could ever be generated", path=where)
        if all_strings(values) or all(_is_scalar(v) for v in values):
            _check_values(values, where)
            return values, where
        return None
    for keyword in ("anyOf", "oneOf"):
        branches = node.get(keyword)
        if (
            isinstance(branches, list)
            and branches
            and all(
                isinstance(b, dict) and "const" in b and _is_scalar(b["const"]) and set(b) - {"const"} <= _ANNOTATIONS
                for b in branches
            )
        ):
            values = [b["const"] for b in branches]
            where = f"{path}.{keyword}"
            _check_values(values, where)
            return values, where
    return None


_UNION_KEYS = _ANNOTATIONS | {"type", "discriminator"}
_BRANCH_KEYS = _ANNOTATIONS | {"type", "properties", "required", "additionalProperties"}


def union_values(node: dict[str, Any], schema: dict[str, Any]) -> tuple[str, str, tuple[str, ...]] | None:
    """``(key, keyword, values)`` where ``node`` is a discriminated union that a trie can decide,
    else None: an ``anyOf`` or ``oneOf`` (the node's other keywords annotations, ``"type":
    "object"`` or OpenAPI's ``discriminator``) of two or more objects, inline or a ``$ref``
    alone, whose first property is the same ``key``, required, and fixed to one string (a
    ``const`` or a one-value ``enum``), distinct across branches: the shape vLLM and SGLang
    build for ``tool_choice="required"``, OpenAI-style ``{"type": ...}`` unions and pydantic's
    discriminated unions. The first property is the first xgrammar emits, so every branch's
    text is the same up to the discriminator's value (additional properties come after the
    declared ones); a union that fixes another property first, or whose first property is
    optional, is xgrammar's alone."""
    keyword = "anyOf" if "anyOf" in node else "oneOf"
    branches = node.get(keyword)
    if (
        not isinstance(branches, list)
        or len(branches) < 2
        or not set(node) - {keyword} <= _UNION_KEYS
        or node.get("type", "object") != "object"
    ):
        return None
    key: str | None = None
    values: list[str] = []
    for branch in branches:
        if isinstance(branch, dict) and set(branch) == {"$ref"} and isinstance(branch["$ref"], str):
            branch = _resolve(schema, branch["$ref"])
        if (
            not isinstance(branch, dict)
            or not set(branch) <= _BRANCH_KEYS
            or branch.get("type", "object") != "object"
            or not isinstance(branch.get("properties"), dict)
            or not branch["properties"]
            or not isinstance(branch.get("required"), list)
        ):
            return None
        first = next(iter(branch["properties"]))
        value = _single_string(branch["properties"][first])
        if value is None or first not in branch["required"] or key not in (None, first):
            return None
        key = first
        values.append(value)
    if key is None or len(set(values)) != len(values):
        return None
    try:
        "".join(values).encode("utf-8")
    except UnicodeEncodeError:
        return None  # (xgrammar's to refuse, as it refuses the schema)
    return key, keyword, tuple(values)


def _single_string(node: Any) -> str | None:
    """The one string a subschema allows (``{"const": s}`` or ``{"enum": [s]}``, with
    annotations and ``"type": "string"``), else None."""
    if not isinstance(node, dict) or node.get("type", "string") != "string":
        return None
    if "const" in node and set(node) <= _ANNOTATIONS | {"const", "type"}:
        value = node["const"]
    elif "enum" in node and set(node) <= _ANNOTATIONS | {"enum", "type"} and isinstance(node["enum"], list):
        value = node["enum"][0] if len(node["enum"]) == 1 else None
    else:
        return None
    return value if type(value) is str else None


def _ref_targets(schema: dict[str, Any]) -> list[tuple[str, ...]]:
    """Where the schema's local ``$ref`` s point (JSON pointer tokens; ``()`` the root)."""
    targets = []
    for node in _dicts_within(schema):
        ref = node.get("$ref")
        tokens = _pointer(ref) if type(ref) is str else None
        if tokens is not None:
            targets.append(tuple(tokens))
    return targets


@dataclass
class _PatternBudget:
    """How many more ``pattern`` automata one schema may build (:data:`MAX_DISPATCHED_PATTERNS`)."""

    left: int = MAX_DISPATCHED_PATTERNS

    def take(self) -> bool:
        self.left -= 1
        return self.left >= 0


def _finite_string(node: dict[str, Any], path: str, patterns: _PatternBudget) -> tuple[str, str] | None:
    """``(pattern, path)`` of a string field whose language is finite and needs no
    escapes (see the module docstring), else None; a ``pattern`` is tried only while
    ``patterns`` allows."""
    keys = set(node)
    if node.get("type") != "string" or not keys & {"format", "pattern"} or keys - _ANNOTATIONS - _STRING_KEYS:
        return None
    if "format" in node and "pattern" in node:
        return None  # xgrammar keeps the format and drops the pattern: leave that to it
    if "format" in node:
        fmt = node["format"]
        return (FORMATS[fmt], f"{path}.format") if fmt in DISPATCHED_FORMATS else None
    pattern = node.get("pattern")
    if not isinstance(pattern, str) or len(pattern) > _MAX_DISPATCHED_PATTERN_CHARS or not patterns.take():
        return None
    try:
        dag = dag_of_pattern(pattern)
    except PatternError:
        return None  # infinite, or beyond this engine: the structural engine's (and its errors)
    if np.isin(dag.byte, _ESCAPED_BYTES).any():
        return None
    return pattern, f"{path}.pattern"


@dataclass(frozen=True)
class StructureCost:
    """What a schema asks of the structural engine's compile, priced before it runs: xgrammar
    0.2.9 on a 151K-token vocabulary (this 2-core machine) compiles a ``pattern`` like
    ``\\w{0,100}\\d\\w{0,100}`` in up to 0.5 s whatever its few bytes, a ``format`` such as
    ``email`` in 20 ms, an object's optional properties in a time growing with their square
    (300: 0.5 s; 1,000: 8.3 s) and anything else in about 0.1 ms a subschema."""

    patterns: int
    formats: int
    optional_squares: int  # the sum over objects of (optional properties)^2
    subschemas: int

    @property
    def milliseconds(self) -> float:
        """The estimated compile time (an upper bound on this machine for the measured shapes)."""
        return 450 * self.patterns + 20 * self.formats + 0.006 * self.optional_squares + 0.1 * self.subschemas

    def __add__(self, other: StructureCost) -> StructureCost:
        return StructureCost(
            self.patterns + other.patterns,
            self.formats + other.formats,
            self.optional_squares + other.optional_squares,
            self.subschemas + other.subschemas,
        )


_COST_KEYWORDS = frozenset({"pattern", "format", "properties"})


def structure_cost(schema: Any) -> StructureCost:
    """:class:`StructureCost` of ``schema`` (annotations count too: an upper bound). In C where
    the extension is built (1,853 tool schemas priced one by one: 0.4 ms against 4.5 ms), else
    :func:`_structure_cost_reference`."""
    native = kernels.KERNELS
    return StructureCost(*native.json_cost(schema)) if native is not None else _structure_cost_reference(schema)


def _structure_cost_reference(schema: Any) -> StructureCost:
    """:func:`structure_cost` in Python."""
    patterns = formats = squares = 0
    nodes = _dicts_within_reference(schema)
    for node in nodes:
        if _COST_KEYWORDS.isdisjoint(node):
            continue  # (most dicts: one set test)
        patterns += isinstance(node.get("pattern"), str)
        formats += isinstance(node.get("format"), str)
        properties = node.get("properties")
        if isinstance(properties, dict):
            required = node.get("required")
            named = {name for name in required if isinstance(name, str)} if isinstance(required, list) else set()
            optional = len(properties.keys() - named)
            squares += optional * optional
    return StructureCost(patterns, formats, squares, len(nodes))


def _pointer(ref: str) -> list[str] | None:
    """The tokens of a local reference (``#/$defs/Name`` -> ``["$defs", "Name"]``, ``#`` -> ``[]``;
    percent-escapes and ``~0`` / ``~1`` decoded), else None."""
    if not ref.startswith("#"):
        return None
    return [unquote(token).replace("~1", "/").replace("~0", "~") for token in ref[1:].split("/")[1:]]


def dispatched_cost(schema: dict[str, Any], structural: dict[str, Any], sites: list[EnumSite]) -> StructureCost:
    """:class:`StructureCost` of what the structural engine compiles for ``schema`` dispatched
    into ``structural`` and ``sites``: the structure, plus for each discriminated union its
    costliest branch (a choice compiles the structure with that branch in the union's place;
    for an array's items, one branch more per element: priced for the first)."""
    cost = structure_cost(structural)
    for site in sites:
        if site.union is not None:
            branches = [structure_cost(branch) for branch in site.union.branches(schema)]
            cost = cost + max(branches, key=lambda c: c.milliseconds)
    return cost


def _resolve(schema: dict[str, Any], ref: str) -> Any:
    """The subschema a local JSON pointer (``#/$defs/Name``) names, else None."""
    tokens = _pointer(ref)
    if tokens is None:
        return None
    node: Any = schema
    for token in tokens:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node


def _key_schemas(schema: dict[str, Any]) -> set[int]:
    """The ids of the subschemas that describe property names: ``propertyNames`` and what it
    references, directly or through other references."""
    roots = [node["propertyNames"] for node in _dicts_within(schema) if isinstance(node.get("propertyNames"), dict)]
    found: set[int] = set()
    while roots:
        node = roots.pop()
        if id(node) in found:
            continue
        found.add(id(node))
        refs = [inner["$ref"] for inner in _dicts_within(node) if isinstance(inner.get("$ref"), str)]
        roots.extend(target for ref in refs if isinstance(target := _resolve(schema, ref), dict))
    return found


def structure_text(structural: dict[str, Any]) -> str:
    """The JSON text of the structural schema as xgrammar is given it: without the annotations
    of its subschemas (:func:`without_annotations`), so that schemas that differ only there
    (a description edited, pydantic's titles) are one structure to the skeleton cache, and
    xgrammar parses less."""
    return json.dumps(without_annotations(structural))


def without_annotations(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` without :data:`XGRAMMAR_ANNOTATIONS` where they are keywords of a subschema
    (reached through the keywords that hold subschemas; a property named "title" and the
    values of ``enum``, ``const`` and the rest stay as they are): a copy of the containers
    that held one, the rest shared; ``schema`` itself where a local ``$ref`` points through
    one of those names (it could point into what would be removed). In C where the extension
    is built (vLLM's schema of 50 tools: 0.01 ms, against 0.5 ms), else
    :func:`_without_annotations_reference`."""
    native = kernels.KERNELS
    if native is None:
        found = _without_annotations_reference(schema)
    else:  # (None: deeper than it goes; schema itself: nothing to remove)
        found = native.schema_without(schema, _ANNOTATIONS, _ONE_KEYWORDS, _LIST_KEYWORDS, _MAP_KEYWORDS)
    if found is None or found is schema or any(not _ANNOTATIONS.isdisjoint(to) for to in _ref_targets(schema)):
        return schema
    return found  # type: ignore[no-any-return]


def _without_annotations_reference(node: Any) -> Any:
    """:func:`without_annotations`'s walk in Python (a copy of every container)."""
    if type(node) is not dict:
        return node
    copied: dict[str, Any] = {}
    for key, value in node.items():
        if key in _ANNOTATIONS:
            continue
        if key in _MAP_KEYWORDS and type(value) is dict:
            value = {name: _without_annotations_reference(child) for name, child in value.items()}
        elif key in _LIST_KEYWORDS and type(value) is list:
            value = [_without_annotations_reference(child) for child in value]
        elif key in _ONE_KEYWORDS:
            value = _without_annotations_reference(value)
        copied[key] = value
    return copied


def _dicts_within(node: Any) -> list[dict[str, Any]]:
    """Every dict inside ``node``, itself included (every subschema, and some dicts that are
    not). In C where the extension is built (a 500-tool schema's 17,000 dicts: 0.5 ms against
    5 ms), else :func:`_dicts_within_reference`, in the same order."""
    native = kernels.KERNELS
    return native.json_containers(node)[0] if native is not None else _dicts_within_reference(node)


def _dicts_within_reference(node: Any) -> list[dict[str, Any]]:
    """:func:`_dicts_within` in Python."""
    found: list[dict[str, Any]] = []
    stack: list[Any] = [node] if type(node) in (dict, list) else []
    while stack:  # (a loaded schema holds exact dicts and lists; containers only are stacked)
        item = stack.pop()
        if type(item) is dict:
            found.append(item)
            stack += [child for child in item.values() if type(child) in (dict, list)]
        else:
            stack += [child for child in item if type(child) in (dict, list)]
    return found


_DISPATCH_KEYWORDS = frozenset({"pattern", "format", "enum", "anyOf", "oneOf", *_UNENFORCED})
"""The keywords :func:`_nothing_to_dispatch` looks at: a dict with none of them is cleared."""
_UNENFORCED_KEYWORDS = frozenset(_UNENFORCED)


def _nothing_to_dispatch(schema: dict[str, Any], min_enum_values: int) -> bool:
    """Whether no part of ``schema`` can become a site nor needs :func:`dispatch`'s checks,
    judged from every dict in it in one pass (most schemas: a function's arguments, a tool
    union with one-value enums), so that dispatch returns it as it is. Anything it cannot
    clear at a glance (an enum or a union of consts that may be large or is not plain, a
    pattern, a format, a keyword xgrammar does not enforce) takes the full visit. In C where
    the extension is built (vLLM's schema of 50 tools: 0.02 ms against 0.08 ms), else
    :func:`_nothing_to_dispatch_reference`."""
    native = kernels.KERNELS
    if native is None:
        return _nothing_to_dispatch_reference(schema, min_enum_values)
    return bool(native.json_plain(schema, _DISPATCH_KEYWORDS, _UNENFORCED_KEYWORDS, min(min_enum_values, sys.maxsize)))


def _nothing_to_dispatch_reference(schema: dict[str, Any], min_enum_values: int) -> bool:
    """:func:`_nothing_to_dispatch` in Python."""
    for node in _dicts_within(schema):
        if _DISPATCH_KEYWORDS.isdisjoint(node):
            continue  # (most dicts: one set test, not the checks below)
        if (
            not _UNENFORCED.keys().isdisjoint(node)
            or type(node.get("pattern")) is str
            or type(node.get("format")) is str
        ):
            return False
        values = node.get("enum")
        if values is None or type(values) is dict:  # (no enum, or a property named "enum")
            for keyword in ("anyOf", "oneOf"):
                branches = node.get(keyword)
                if type(branches) is list and (
                    len(branches) >= min_enum_values or any(type(b) is dict and "const" in b for b in branches)
                ):
                    return False  # perhaps a union of consts (an enum), or a discriminated union
            continue
        if type(values) is not list or not 0 < len(values) < min_enum_values:
            return False
        try:
            "".join(v for v in values if type(v) is str).encode("utf-8")
        except UnicodeEncodeError:
            return False  # _check_values names the value
    return True


def dispatch(
    schema: dict[str, Any], min_enum_values: int, *, min_union_branches: int | None = None, patterns: bool = True
) -> tuple[dict[str, Any], list[EnumSite], tuple[str, ...]]:
    """A copy of ``schema`` (as :func:`load_schema` gives it: plain dicts and lists) with every
    enum site replaced by a const placeholder (``schema`` itself is not modified).
    ``patterns=False`` builds no pattern automaton (a serving front end checks a schema's
    errors without the costly part of its compile). Discriminated unions with at least
    ``min_union_branches`` branches (default ``min_enum_values``) are sites too, where they
    occur at most once in an instance or are the items of such an array (:class:`UnionChoice`).

    Returns the rewritten schema and the sites, in the order they were found (``schema``
    itself where nothing is replaced: the caller must not modify either), and the paths of
    the keywords xgrammar does not enforce, in the schema's order (a node's before those below it).
    """
    min_union_branches = min_enum_values if min_union_branches is None else min_union_branches
    if _nothing_to_dispatch(schema, min(min_enum_values, min_union_branches)):
        return schema, [], ()
    unenforced: list[str] = []
    nonce = secrets.token_hex(8)
    sites: list[EnumSite] = []
    key_schemas = _key_schemas(schema)
    budget = _PatternBudget(MAX_DISPATCHED_PATTERNS if patterns else 0)

    def distinct(values: list[Any]) -> tuple[Any, ...]:
        if all_strings(values):
            return tuple(dict.fromkeys(values))
        unique: dict[str, Any] = {}
        for value in values:  # 1 and 1.0 are one JSON value; True and 1 are not
            unique.setdefault(json.dumps(value, sort_keys=True) + type(value).__name__[:1], value)
        return tuple(unique.values())

    references: list[tuple[str, ...]] | None = None  # where the $refs point (found when a union is)

    def shared(pointer: Pointer) -> bool:
        """Whether a ``$ref`` points at, above or below ``pointer`` (it may then occur twice)."""
        nonlocal references
        references = _ref_targets(schema) if references is None else references
        at = tuple(map(str, pointer))
        return any(at[: len(t)] == t or t[: len(at)] == at for t in references)

    def union_site(node: dict[str, Any], path: str, at: Pointer, place: Pointer | None, array: Pointer | None) -> Any:
        """The structural stand-in of a discriminated union that is a site, else None."""
        found = union_values(node, schema) if unions_allowed else None
        if found is None or len(found[2]) < min_union_branches:
            return None
        key, keyword, values = found
        pointer = place if place is not None else array
        assert pointer is not None
        if shared(pointer if place is not None else (*pointer, "items")):
            return None
        placeholder = f"triemask-{nonce}-{len(sites)}"
        choice = UnionChoice(pointer, key, keyword, repeated=place is None)
        sites.append(EnumSite(f"{path}.{keyword}", values, placeholder, union=choice, at=at))
        return {"type": "object", "properties": {key: {"const": placeholder}}, "required": [key]}

    def visit(
        node: Any,
        path: str,
        at: Pointer,
        keys: bool = False,
        place: Pointer | None = None,
        array: Pointer | None = None,
    ) -> Any:
        """``keys``: the node describes property names (``propertyNames``, and what it
        references), which stay xgrammar's: a field's sentinel stands for a value, never a key.
        ``place``: where the node is, if it occurs at most once in an instance (reached from
        the root through properties, union branches and prefix items only); ``array``: where
        its array is, if it is the ``items`` of such an array (see :class:`UnionChoice`)."""
        if not isinstance(node, dict):
            return node
        keys = keys or id(node) in key_schemas
        skipped = [k for k in node if k in _UNENFORCED and (node[k] is not _UNENFORCED[k] or _UNENFORCED[k] is None)]
        unenforced.extend(f"{path}.{keyword}" for keyword in skipped)
        if not keys and (place is not None or array is not None) and not skipped:
            stand_in = union_site(node, path, at, place, array)
            if stand_in is not None:
                return stand_in
        found = None if keys else _enum_values(node, path)
        if found is not None:
            values = distinct(found[0])
            if len(values) >= min_enum_values:
                placeholder = f"triemask-{nonce}-{len(sites)}"
                sites.append(EnumSite(found[1], values, placeholder, at=at))
                return {"const": placeholder}
        finite = None if keys else _finite_string(node, path, budget)
        if finite is not None:
            placeholder = f"triemask-{nonce}-{len(sites)}"
            sites.append(EnumSite(finite[1], (), placeholder, finite[0], at=at))
            return {"const": placeholder}
        if _CHILDREN.isdisjoint(node):  # a leaf (most subschemas): nothing below to visit
            return node
        node = dict(node)  # shallow: the caller's schema is never modified, enum lists are not copied
        # (below an unenforced keyword, every site is xgrammar's)
        once: Pointer | None = place if not skipped else None

        def inside(*steps: str | int) -> Pointer | None:
            return None if once is None else (*once, *steps)

        for key in _MAP:
            children = node.get(key)
            if isinstance(children, dict) and key not in skipped:
                node[key] = {
                    name: child
                    if (key, name) in unreached and not at  # (left to xgrammar, which leaves it out)
                    else visit(
                        child,
                        _key_path(_key_path(path, key), name),
                        (*at, key, name),
                        keys,
                        inside(key, name) if key == "properties" else None,
                    )
                    for name, child in children.items()
                }
        for key in _LIST:
            children = node.get(key)
            if isinstance(children, list):
                node[key] = [
                    visit(child, f"{path}.{key}[{i}]", (*at, key, i), keys, inside(key, i) if key != "allOf" else None)
                    for i, child in enumerate(children)
                ]
        for key in _ONE:
            if isinstance(node.get(key), dict) and key not in skipped:
                # the items of an array that occurs once: each element chooses anew
                node[key] = visit(node[key], f"{path}.{key}", (*at, key), keys, None, once if key == "items" else None)
        return node

    unreached: set[tuple[str | int, ...]] = set()
    unions_allowed = True

    def again() -> Any:
        """The visit from the start (after a decision above changed what may be a site)."""
        sites.clear()
        unenforced.clear()
        budget.left = MAX_DISPATCHED_PATTERNS if patterns else 0
        return visit(schema, "$", (), False, ())

    try:
        structural = visit(schema, "$", (), False, ())
        # A union's choice is compiled during decoding (inside a serving engine's step): where
        # the structure with its costliest branch would take xgrammar more than
        # MAX_CHOICE_COMPILE_MS, the unions stay xgrammar's, compiled ahead like the rest.
        if any(site.union for site in sites) and (
            dispatched_cost(schema, structural, sites).milliseconds > MAX_CHOICE_COMPILE_MS
        ):
            unions_allowed = False
            structural = again()
        # A definition nothing refers to is out of the structure (xgrammar's grammar leaves it
        # out: one only a union's branches refer to, each choice compiling it; one a schema
        # defines and never uses), so no site goes there: visited again, those definitions are
        # left as they are. (Had a reference escaped this reading, xgrammar would compile the
        # enum itself: slower, never another language.)
        in_definitions = {site.at[:2] for site in sites if site.at[:1] in (("$defs",), ("definitions",))}
        unreached = in_definitions - _reachable_definitions(structural)
        if unreached:
            structural = again()
    except RecursionError:
        raise SchemaError(f"{TOO_DEEP} (beyond Python's recursion limit)", path="$") from None
    return structural, sites, tuple(unenforced)


def _reachable_definitions(schema: dict[str, Any]) -> set[tuple[str, ...]]:
    """``("$defs", name)`` (or ``"definitions"``) of every definition a ``$ref`` outside the
    definitions reaches, directly or through other definitions."""
    found: set[tuple[str, ...]] = set()
    definitions: dict[str, dict[str, Any]] = {
        key: value for key in ("$defs", "definitions") if isinstance(value := schema.get(key), dict)
    }
    pending = [{k: v for k, v in schema.items() if k not in definitions}]
    while pending:
        for node in _dicts_within(pending.pop()):
            ref = node.get("$ref")
            tokens = _pointer(ref) if type(ref) is str else None
            if (
                tokens is not None
                and len(tokens) >= 2
                and tokens[0] in definitions
                and (tokens[0], tokens[1]) not in found
            ):
                found.add((tokens[0], tokens[1]))
                target = definitions[tokens[0]].get(tokens[1])
                if target is not None:
                    pending.append(target)
    return found


def _needs_escape(text: str) -> bool:
    """Whether ``text`` holds a character JSON spells escaped (a control, a quote, a backslash;
    DEL, as xgrammar escapes it): the bytes that need none deleted, what is left tells (10x
    faster than a regular expression over the 3,000 values of an enum)."""
    return bool(text.encode("utf-8", "surrogatepass").translate(None, _UNESCAPED_BYTES))


def json_texts(values: tuple[Any, ...], path: str) -> list[bytes]:
    """The JSON text of each value, as the structural engine spells it.

    Strings: picojson's escapes (``\\"``, ``\\\\``, the short escapes, ``\\u00xx`` for the
    other control characters and DEL), everything else as raw UTF-8. Numbers, booleans
    and null: the text xgrammar itself prints for them (it reformats numbers: ``1.0``
    is ``1``, ``1e20`` is ``1e+20``), read from the grammar it builds.
    """
    # the common case: every text is its value in quotes (one encode, no NUL inside)
    if all_strings(values) and not _needs_escape("".join(values)):
        return ('"' + '"\x00"'.join(values) + '"').encode("utf-8").split(b"\x00")
    texts: list[bytes | None] = []
    others: list[Any] = []
    for value in values:
        if isinstance(value, str):
            if not _needs_escape(value):  # most values: the text is the value in quotes
                texts.append(f'"{value}"'.encode())
            else:
                texts.append(json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f").encode("utf-8"))
        else:
            texts.append(None)
            others.append(value)
    if others:
        spelled = iter(_xgrammar_literals(others, path))
        texts = [text if text is not None else next(spelled) for text in texts]
    return [text for text in texts if text is not None]


def _xgrammar_literals(values: list[Any], path: str) -> list[bytes]:
    import xgrammar

    grammar = str(xgrammar.Grammar.from_json_schema(json.dumps({"enum": values})))
    root = next(line for line in grammar.splitlines() if line.startswith("root ::= "))
    literals = re.findall(r'\("([^"\\]*)"\)', root)
    if len(literals) != len(values):  # pragma: no cover - a change in xgrammar's printing
        raise SchemaError(f"{path}: cannot read xgrammar's spelling of {values!r:.80}", path=path)
    return [literal.encode("ascii") for literal in literals]
