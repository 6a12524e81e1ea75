"""LangChain's MCP adapters (`langchain-mcp-adapters`) against toolgate's
front door: the tools load as LangChain tools and are invoked as an agent's
tool calls are. Prints one JSON report; the Rust test judges it.

    front_langchain.py URL     TOOLGATE_FRONT_KEY: the bearer credential
"""

import asyncio
import json
import os
import sys

from langchain_mcp_adapters.client import MultiServerMCPClient

URL = sys.argv[1]
KEY = os.environ["TOOLGATE_FRONT_KEY"]


async def main():
    client = MultiServerMCPClient(
        {"toolgate": {"transport": "streamable_http", "url": URL, "headers": {"Authorization": f"Bearer {KEY}"}}}
    )
    tools = await client.get_tools()
    by_name = {tool.name: tool for tool in tools}
    report = {"tools": sorted(by_name)}
    report["echo"] = str(await by_name["demo-echo"].ainvoke({"text": "from langchain"}))
    try:
        report["denied"] = str(await by_name["demo-keyed_write"].ainvoke({"line": "no"}))
    except Exception as error:  # the adapters raise on an isError result
        report["denied"] = f"{type(error).__name__}: {error}"
    print(json.dumps(report))


asyncio.run(main())
