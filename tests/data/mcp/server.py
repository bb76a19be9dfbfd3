"""An MCP server on the official Python SDK (FastMCP), for `keel mcp add`.

Its `greet` tool's description is read from the file named by GREETING_FILE when the server
starts (so a test can change it between runs); `crash` ends the process mid-call the first
time it is called in a directory (MARKER_DIR) and answers afterwards; `hang` never answers;
`crash_always` ends it every time; `echo` answers at once (the benchmark's call).
"""

import asyncio
import os
import sys

from mcp.server.fastmcp import FastMCP

mcp = FastMCP("keel-test-server")

description = "Greets someone."
path = os.environ.get("GREETING_FILE")
if path and os.path.exists(path):
    with open(path) as f:
        description = f.read().strip()


@mcp.tool(description=description)
def greet(name: str) -> str:
    return f"hello {name}"


@mcp.tool()
def echo(text: str) -> dict:
    """Returns its input."""
    return {"text": text}


@mcp.tool()
def crash() -> str:
    """Stops the server the first time (per MARKER_DIR), then answers."""
    marker = os.path.join(os.environ.get("MARKER_DIR", "/tmp"), "crashed")
    if not os.path.exists(marker):
        open(marker, "w").close()
        sys.stderr.write("crash: exiting on purpose\n")
        sys.stderr.flush()
        os._exit(3)
    return "survived"


@mcp.tool()
def crash_always() -> str:
    """Stops the server every time."""
    os._exit(4)


@mcp.tool()
async def hang() -> str:
    """Never answers in time (without blocking the server's other calls)."""
    await asyncio.sleep(3600)
    return "late"


@mcp.tool()
def secret() -> str:
    """Tells whether a variable of keel's own environment leaked into the server's."""
    return os.environ.get("LEAK_CHECK", "absent") + " " + os.environ.get("GIVEN", "none")


if __name__ == "__main__":
    mcp.run()
