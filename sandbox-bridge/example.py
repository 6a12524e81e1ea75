"""The quickstart's sample script: a builtin and a stdio MCP tool, called
through the turn's bridge."""

from toolgate_bridge import Denied, call, text

print(text(call("demo.echo", text="hello from the sandbox")))
print(text(call("mcp.everything.get_sum", a=2, b=40)))
try:
    call("demo.external_write", line="not without a human")
except Denied as denied:
    print("denied:", denied.reason_code)
