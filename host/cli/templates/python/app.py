"""The component: keel's `tools` interface (componentize-py's bindings of `wit/tool.wit`,
generated into the module `wit_world` at build time) over the @tool functions of `logic.py`.
Nothing here changes when you add a tool: mark another function in logic.py with @tool."""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import types

import keel_tool
import logic  # noqa: F401 (its @tool functions are the component's tools)

EFFECTS = {
    "read-only": types.Effect.READ_ONLY,
    "workspace-write": types.Effect.WORKSPACE_WRITE,
    "external": types.Effect.EXTERNAL,
    "destructive": types.Effect.DESTRUCTIVE,
}


class Tools(exports.Tools):
    def describe(self) -> list[types.ToolSpec]:
        return [
            types.ToolSpec(
                name=spec["name"],
                description=spec["description"],
                input_schema=json.dumps(spec["input_schema"]),
                output_schema=json.dumps(spec["output_schema"]) if spec["output_schema"] else None,
                effect=EFFECTS[spec["effect"]],
                idempotent=spec["idempotent"],
            )
            for _, spec in keel_tool.TOOLS.values()
        ]

    def invoke(self, name: str, input: str) -> str:
        entry = keel_tool.TOOLS.get(name)
        if entry is None:
            raise Err(types.ToolError_UnknownTool(f"no tool named {name}"))
        try:
            args = json.loads(input)
        except ValueError as e:
            raise Err(types.ToolError_InvalidInput(f"the input is not JSON: {e}"))
        try:
            return json.dumps(entry[0](**args))
        except (ValueError, TypeError) as e:
            raise Err(types.ToolError_InvalidInput(str(e)))
        except keel_tool.NotFound as e:
            raise Err(types.ToolError_NotFound(str(e)))
        except (keel_tool.Denied, PermissionError) as e:
            raise Err(types.ToolError_Denied(str(e)))
        except FileNotFoundError as e:
            raise Err(types.ToolError_NotFound(str(e)))
        except Exception as e:
            raise Err(types.ToolError_Failed(f"{type(e).__name__}: {e}"))
