"""keel tools in Python: a tool is a function marked with @tool.

Its input schema comes from the function's parameters and their type annotations, its output
schema from the return annotation, and its description from the docstring:

- str, int, float, bool, list[T], dict[str, T], Literal["a", "b"], a TypedDict (an object
  whose keys are its fields), T | None, and Any;
- Annotated[T, "text"] gives a field its description;
- a parameter with a default may be left out (the default is in the schema).

keel checks every input against the schema before the function runs, so the function gets
the fields it declared, with the types it declared. Raise ValueError for an input it cannot
use, NotFound, Denied or Failed (below) for the other failures a caller should see.
"""

import inspect
import json
import types
import typing
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

EFFECTS = ("read-only", "workspace-write", "external", "destructive")

# name -> (function, spec)
TOOLS = {}


class NotFound(Exception):
    """A file or other resource the input names does not exist."""


class Denied(Exception):
    """The sandbox refused access (outside the grants, or a read-only grant)."""


class Failed(Exception):
    """The tool ran but could not do what was asked."""


def tool(name=None, effect="read-only", idempotent=None):
    """Marks a function as a tool of this component (named after the function unless `name`)."""
    if effect not in EFFECTS:
        raise ValueError(f"effect must be one of {', '.join(EFFECTS)}, not {effect!r}")

    def register(fn):
        tool_name = name or fn.__name__
        hints = get_type_hints(fn, include_extras=True)
        spec = {
            "name": tool_name,
            "description": (inspect.getdoc(fn) or "").strip(),
            "input_schema": input_schema(fn, hints),
            "output_schema": schema_of(hints["return"])[0] if "return" in hints else None,
            "effect": effect,
            "idempotent": effect == "read-only" if idempotent is None else idempotent,
        }
        TOOLS[tool_name] = (fn, spec)
        return fn

    return register


def input_schema(fn, hints=None):
    """The JSON Schema of a tool function's input: an object of its parameters."""
    hints = hints if hints is not None else get_type_hints(fn, include_extras=True)
    properties, required = {}, []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise TypeError(f"{fn.__name__}: parameter `{p.name}` must be a plain named parameter")
        if p.name not in hints:
            raise TypeError(f"{fn.__name__}: parameter `{p.name}` needs a type annotation")
        schema, optional = schema_of(hints[p.name])
        if p.default is not inspect.Parameter.empty:
            optional = True
            if p.default is not None:
                schema["default"] = json.loads(json.dumps(p.default))
        properties[p.name] = schema
        if not optional:
            required.append(p.name)
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}


def schema_of(t):
    """The JSON Schema of an annotation, and whether it may be left out (it admits None)."""
    origin = get_origin(t)
    if origin is Annotated:
        base, *extra = get_args(t)
        schema, optional = schema_of(base)
        for e in extra:
            if isinstance(e, str):
                schema["description"] = e
        return schema, optional
    if t is type(None):
        return {"type": "null"}, True
    if t is Any:
        return {}, False
    if t in _SCALARS:
        return {"type": _SCALARS[t]}, False
    if origin in (Union, types.UnionType):
        args = get_args(t)
        kept = [a for a in args if a is not type(None)]
        optional = len(kept) < len(args)
        if len(kept) == 1:
            return schema_of(kept[0])[0], optional
        return {"anyOf": [schema_of(a)[0] for a in kept]}, optional
    if origin is Literal:
        return {"enum": list(get_args(t))}, False
    if t is list or origin is list:
        args = get_args(t)
        return ({"type": "array", "items": schema_of(args[0])[0]} if args else {"type": "array"}), False
    if t is dict or origin is dict:
        args = get_args(t)
        if args and args[0] is not str:
            raise TypeError(f"{t!r}: a JSON object's keys are strings (dict[str, ...])")
        schema = {"type": "object"}
        if args:
            schema["additionalProperties"] = schema_of(args[1])[0]
        return schema, False
    if typing.is_typeddict(t):
        hints = get_type_hints(t, include_extras=True)
        properties = {k: schema_of(v)[0] for k, v in hints.items()}
        schema = {
            "type": "object",
            "properties": properties,
            "required": [k for k in hints if k in t.__required_keys__],
        }
        if t.__doc__ and not t.__doc__.startswith(t.__name__ + "("):
            schema["description"] = inspect.cleandoc(t.__doc__)
        return schema, False
    raise TypeError(
        f"no JSON Schema for the annotation {t!r}: use str, int, float, bool, list[...], "
        "dict[str, ...], Literal[...], a TypedDict, or a union of them with None"
    )
