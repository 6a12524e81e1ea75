"""The quickstart's sample script: values from a builtin and from a stdio
MCP tool's structured result, composed in code, then a refusal."""

from toolgate_bridge import Denied, call

print(call("demo.echo", text="hello from the sandbox"))
temperatures = {
    city: call("mcp.everything.get_structured_content", location=city)["temperature"]
    for city in ("New York", "Chicago")
}
warmest = max(temperatures, key=lambda city: temperatures[city])
print("warmest:", warmest, temperatures[warmest])
try:
    call("demo.external_write", line="not without a human")
except Denied as denied:
    print("denied:", denied.reason_code)
