"""Times N calls of one tool from the official Python SDK client over stdio.

Usage: bench_client.py N TOOL ARGS_JSON COMMAND [ARGS...]
Prints {"calls": N, "ms": [...]} (one duration per call, after one warm-up call).
"""

import asyncio
import json
import sys
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main():
    n, tool, args = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    params = StdioServerParameters(command=sys.argv[4], args=sys.argv[5:])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            first = await s.call_tool(tool, args)
            if first.isError:
                raise SystemExit(f"{tool} failed: {first.content}")
            ms = []
            for _ in range(n):
                t = time.perf_counter()
                r = await s.call_tool(tool, args)
                ms.append((time.perf_counter() - t) * 1e3)
                assert not r.isError
    print(json.dumps({"calls": n, "ms": ms}))


asyncio.run(main())
