"""A keel tool written in Python: `py_word_count` counts the lines, words and bytes of a file
inside the directories granted to the session.

Built into a WebAssembly component with componentize-py against keel's `wit/tool.wit`
(world `tool`); see README.md.
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host, types

INPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "A file inside a granted directory."}
    },
    "required": ["path"],
    "additionalProperties": False,
}


def word_count(path: str) -> dict:
    lines = words = size = 0
    with open(path, "rb") as f:
        for line in f:
            lines += 1
            words += len(line.split())
            size += len(line)
    return {"path": path, "lines": lines, "words": words, "bytes": size}


class Tools(exports.Tools):
    def describe(self) -> list[types.ToolSpec]:
        return [
            types.ToolSpec(
                name="py_word_count",
                description="Counts the lines, words and bytes of a text file.",
                input_schema=json.dumps(INPUT_SCHEMA),
                output_schema=None,
                effect=types.Effect.READ_ONLY,
                idempotent=True,
            )
        ]

    def invoke(self, name: str, input: str) -> str:
        if name != "py_word_count":
            raise Err(types.ToolError_UnknownTool(f"no tool named {name}"))
        try:
            args = json.loads(input)
            path = args["path"]
        except (ValueError, KeyError, TypeError) as e:
            raise Err(types.ToolError_InvalidInput(f"expected {{\"path\": ...}}: {e}"))
        host.log(host.LogLevel.INFO, f"counting {path}")
        try:
            return json.dumps(word_count(path))
        except FileNotFoundError:
            raise Err(types.ToolError_NotFound(f"{path}: no such file"))
        except PermissionError as e:
            raise Err(types.ToolError_Denied(f"{path}: {e}"))
        except OSError as e:
            raise Err(types.ToolError_Failed(f"{path}: {e}"))
