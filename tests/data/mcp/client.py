"""An MCP client on the official Python SDK, driving `keel mcp serve`.

Usage: client.py stdio ELICIT KEEL_ARGS...   (starts keel as its stdio server)
       client.py http ELICIT URL [TOKEN]
ELICIT is `approve`, `reject` or `none` (the client declares no elicitation). It lists the
tools, makes the calls below, and prints one JSON object: what each step returned.
"""

import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client

ASKED = []


def make_elicit(answer):
    async def elicit(context, params):
        ASKED.append(params.message)
        if answer == "approve":
            return types.ElicitResult(action="accept", content={"approve": True})
        return types.ElicitResult(action="accept", content={"approve": False, "reason": "not today"})

    return elicit


def result(r):
    return {
        "is_error": bool(r.isError),
        "text": "\n".join(c.text for c in r.content if isinstance(c, types.TextContent)),
        "structured": r.structuredContent,
    }


async def drive(read, write, answer):
    elicit = None if answer == "none" else make_elicit(answer)
    async with ClientSession(read, write, elicitation_callback=elicit) as s:
        init = await s.initialize()
        out = {"server": init.serverInfo.name, "protocol": init.protocolVersion}
        tools = (await s.list_tools()).tools
        out["tools"] = {
            t.name: (t.annotations.model_dump(exclude_none=True) if t.annotations else None)
            for t in tools
        }
        out["read"] = result(await s.call_tool("fs_read_file", {"path": "/work/notes.txt"}))
        out["escape"] = result(await s.call_tool("fs_read_file", {"path": "/work/../../etc/passwd"}))
        out["bad_input"] = result(await s.call_tool("fs_read_file", {"nope": 1}))
        out["delete"] = result(await s.call_tool("fs_delete_files", {"paths": ["/work/old.txt"]}))
        out["asked"] = ASKED
        try:
            await s.send_request(
                types.ClientRequest(types.ListPromptsRequest(method="prompts/list")),
                types.ListPromptsResult,
            )
            out["prompts"] = "answered"
        except Exception as e:  # the server has no prompts: a JSON-RPC error
            out["prompts"] = str(e)
        return out


async def main():
    mode, answer = sys.argv[1], sys.argv[2]
    if mode == "stdio":
        params = StdioServerParameters(command=sys.argv[3], args=sys.argv[4:])
        async with stdio_client(params) as (read, write):
            out = await drive(read, write, answer)
    else:
        headers = {"Authorization": f"Bearer {sys.argv[4]}"} if len(sys.argv) > 4 else None
        async with streamablehttp_client(sys.argv[3], headers=headers) as (read, write, _):
            out = await drive(read, write, answer)
    print(json.dumps(out))


asyncio.run(main())
