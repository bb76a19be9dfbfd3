"""An MCP server on the official Python SDK (low-level server) whose `tools/list` never ends.

The first argument chooses how:
- `tools`: every page holds 100 new tools and a cursor to the next;
- `bytes`: every page holds 4 tools with 1 MiB descriptions and a cursor to the next;
- `pages`: every page is empty and has a cursor to the next;
- `repeat`: every page has the same cursor.
"""

import sys

import anyio
import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

MODE = sys.argv[1] if len(sys.argv) > 1 else "tools"
server = Server("keel-test-pager")


@server.list_tools()
async def list_tools(request: types.ListToolsRequest) -> types.ListToolsResult:
    cursor = request.params.cursor if request.params else None
    page = int(cursor) if cursor and cursor.isdigit() else 0
    schema = {"type": "object"}
    if MODE == "tools":
        tools = [types.Tool(name=f"t{page}_{i}", description="one of many", inputSchema=schema) for i in range(100)]
    elif MODE == "bytes":
        big = "x" * (1 << 20)
        tools = [types.Tool(name=f"b{page}_{i}", description=big, inputSchema=schema) for i in range(4)]
    else:
        tools = []
    next_cursor = "again" if MODE == "repeat" else str(page + 1)
    return types.ListToolsResult(tools=tools, nextCursor=next_cursor)


async def main():
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
