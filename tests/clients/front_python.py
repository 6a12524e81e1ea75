"""The official Python MCP SDK (`mcp` on PyPI) against toolgate's front door,
as an application uses it. Prints one JSON report; the Rust test judges it.

    front_python.py PHASE URL
    PHASE: first, second, reissue (a call whose stream a proxy breaks,
    asked again after the application reconnects, as the SDK leaves it to),
    or artifacts (results read whole through their resource links;
    TOOLGATE_OTHER_KEY: another principal's credential), or whoami (an
    oauth2_user server's tool, mcp-crm-whoami, called once)
    TOOLGATE_FRONT_KEY: the bearer credential; TOOLGATE_RUN_ID: the run
    the named calls are in; TOOLGATE_BIN, TOOLGATE_KEY_FILE: for the relay;
    TOOLGATE_ERA: the SDK's mode, "legacy" (initialize and a session, the
    default) or "2026-07-28" (stateless).
"""

import asyncio
import base64
import json
import os
import sys

from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

PHASE, URL = sys.argv[1], sys.argv[2]
KEY = os.environ["TOOLGATE_FRONT_KEY"]
RUN = os.environ["TOOLGATE_RUN_ID"]
ERA = os.environ.get("TOOLGATE_ERA", "legacy")


def named(step, call_id):
    return {"toolgate/run_id": RUN, "toolgate/step": step, "toolgate/call_id": call_id}


def summary(result):
    return {
        "is_error": bool(result.is_error),
        "text": " ".join(getattr(block, "text", "") for block in result.content),
        "structured": result.structured_content,
        "invocation_id": (result.meta or {}).get("toolgate/invocation_id"),
        "reissue": (result.meta or {}).get("toolgate/reissue"),
    }


def client():
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {KEY}"})
    return Client(streamable_http_client(URL, http_client=http), mode=ERA)


async def first(report):
    async with client() as session:
        report["protocol_version"] = session.protocol_version
        tools = await session.list_tools()
        report["tools"] = sorted(tool.name for tool in tools.tools)
        report["annotations"] = {
            tool.name: tool.annotations.model_dump(by_alias=True, exclude_none=True)
            for tool in tools.tools
            if tool.annotations is not None
        }
        report["echo"] = summary(await session.call_tool("demo-echo", {"text": "from python"}))
        report["denied"] = summary(await session.call_tool("demo-keyed_write", {"line": "no"}))
        report["uncertain"] = summary(await session.call_tool("mcp-writes-write_then_die", {"line": "maybe"}))
        progress = []

        async def on_progress(value, total, message):
            progress.append(message)

        report["pending"] = summary(
            await session.call_tool(
                "demo-external_write", {"line": "python"}, progress_callback=on_progress, meta=named(1, "approve-me")
            )
        )
        report["progress"] = progress
        report["write"] = summary(await session.call_tool("mcp-writes-write", {"line": "python"}, meta=named(1, "write")))


async def second(report):
    # A client that reconnects (a new session) and asks its calls again:
    # the write is not repeated, the approved call runs once.
    async with client() as session:
        report["write_again"] = summary(await session.call_tool("mcp-writes-write", {"line": "python"}, meta=named(1, "write")))
        report["resumed"] = summary(await session.call_tool("demo-external_write", {"line": "python"}, meta=named(1, "approve-me")))
        report["resumed_again"] = summary(await session.call_tool("demo-external_write", {"line": "python"}, meta=named(1, "approve-me")))
    # A desktop client that only spawns stdio servers, through the relay.
    relay = StdioServerParameters(
        command=os.environ["TOOLGATE_BIN"],
        args=["stdio", "--url", URL, "--token-file", os.environ["TOOLGATE_KEY_FILE"]],
    )
    async with Client(relay, mode=ERA) as session:
        tools = await session.list_tools()
        report["relay_tools"] = len(tools.tools)
        report["relay_echo"] = summary(await session.call_tool("demo-echo", {"text": "through the relay"}))


async def reissue(report):
    # The stream of this call breaks after its effect; the SDK raises, as
    # an application meets it, and the application reconnects and asks
    # for the same call again, naming nothing.
    try:
        async with client() as session:
            report["protocol_version"] = session.protocol_version
            await session.call_tool("mcp-writes-write", {"line": "sdk"})
        report["broken"] = None
    except BaseException as error:  # an ExceptionGroup when the stream breaks
        report["broken"] = type(error).__name__
    async with client() as session:
        report["again"] = summary(await session.call_tool("mcp-writes-write", {"line": "sdk"}))
        # Delivered now: the application's next identical call is a new one.
        report["new"] = summary(await session.call_tool("mcp-writes-write", {"line": "sdk"}))


def blocks(result):
    return [block.model_dump(by_alias=True, exclude_none=True) for block in result.content]


async def read(session, uri):
    """The bytes a resource link reads, or the error the client met."""
    try:
        contents = (await session.read_resource(uri)).contents
        return {"bytes": base64.b64decode(contents[0].blob), "mime_type": contents[0].mime_type}
    except Exception as error:  # McpError, as an application meets it
        return {"error": str(error)}


async def artifacts(report):
    # A result too large to carry, an image that fits the call's limit and
    # one that does not: what the client reads of each.
    async with client() as session:
        huge = blocks(await session.call_tool("mcp-media-huge", {"bytes": 200000}))
        report["huge_types"] = [block["type"] for block in huge]
        link = next(block for block in huge if block["type"] == "resource_link")
        report["huge_link"] = {key: link.get(key) for key in ("uri", "mimeType", "size")}
        whole = await read(session, link["uri"])
        report["huge_read"] = {"length": len(whole.get("bytes", b"")), "distinct": sorted(set(whole.get("bytes", b"").decode())),
                               "mime_type": whole.get("mime_type"), "error": whole.get("error")}
        small = blocks(await session.call_tool("mcp-media-image", {"bytes": 300}))
        report["small_image"] = [{"type": block["type"], "mimeType": block.get("mimeType"),
                                  "length": len(base64.b64decode(block.get("data", "")))} for block in small]
        large = blocks(await session.call_tool("mcp-media-image", {"bytes": 100000}))
        report["large_image"] = [{key: block.get(key) for key in ("type", "mimeType", "size", "uri")} for block in large]
        large_read = await read(session, large[0].get("uri", ""))
        report["large_read"] = {"length": len(large_read.get("bytes", b"")), "mime_type": large_read.get("mime_type"),
                                "error": large_read.get("error")}
        report["listed"] = len((await session.list_resources()).resources)
        # Another run's link with this artifact's id names nothing.
        forged = link["uri"].replace(link["uri"].split("/")[3], "00000000-0000-4000-8000-000000000000")
        report["forged"] = (await read(session, forged)).get("error")
    # Another principal of the same tenant, with the very link.
    other = Client(streamable_http_client(URL, http_client=create_mcp_http_client(
        headers={"Authorization": f"Bearer {os.environ['TOOLGATE_OTHER_KEY']}"})), mode=ERA)
    async with other as session:
        report["other"] = (await read(session, link["uri"])).get("error")


async def whoami(report):
    async with client() as session:
        result = await session.call_tool("mcp-crm-whoami", {})
        report["whoami"] = summary(result)
        report["consent"] = (result.meta or {}).get("toolgate/consent")


async def main():
    report = {}
    phases = {"first": first, "second": second, "reissue": reissue, "artifacts": artifacts, "whoami": whoami}
    await phases[PHASE](report)
    print(json.dumps(report))


asyncio.run(main())
