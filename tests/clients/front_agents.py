"""The OpenAI Agents SDK's MCP client against toolgate's front door: an
Agent given the front door as its MCP server loads its tools as an
application does, and the model's tool calls (made here directly, with no
model) go through them. Prints one JSON report; the Rust test judges it.

    front_agents.py URL        TOOLGATE_FRONT_KEY: the bearer credential
"""

import asyncio
import json
import os
import sys

from agents import Agent, RunContextWrapper
from agents.mcp import MCPServerStreamableHttp
from agents.tool_context import ToolContext

URL = sys.argv[1]
KEY = os.environ["TOOLGATE_FRONT_KEY"]


async def main():
    report = {}
    server = MCPServerStreamableHttp(
        params={"url": URL, "headers": {"Authorization": f"Bearer {KEY}"}, "timeout": 30},
        name="toolgate",
        cache_tools_list=True,
    )
    async with server:
        agent = Agent(name="assistant", instructions="Use the tools.", mcp_servers=[server])
        context = RunContextWrapper(context=None)
        tools = await agent.get_all_tools(context)
        report["tools"] = sorted(tool.name for tool in tools)
        by_name = {tool.name: tool for tool in tools}
        for key, name, arguments in [
            ("echo", "demo-echo", {"text": "from an agent"}),
            ("denied", "demo-keyed_write", {"line": "no"}),
        ]:
            tool = by_name[name]
            output = await tool.on_invoke_tool(
                ToolContext(context=None, tool_name=name, tool_call_id=f"call_{key}", tool_arguments=json.dumps(arguments)),
                json.dumps(arguments),
            )
            report[key] = output if isinstance(output, str) else json.dumps(output, default=str)
    print(json.dumps(report))


asyncio.run(main())
