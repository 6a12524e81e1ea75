"""The in-sandbox client for toolgate's orchestration bridge.

Standard library only. Reads the turn's socket path and token from the
environment (``TOOLGATE_BRIDGE_SOCKET``, ``TOOLGATE_BRIDGE_TOKEN``), and
makes calls one at a time so the bridge's ordinals, and with them the call
ids a replayed script deduplicates on, stay deterministic.

    from toolgate_bridge import call, tools
    print(call("demo.echo", text="hello"))

``call`` returns the tool's content when it succeeded and raises one typed
exception per other status: ``Denied``, ``Failed``, ``Unavailable``,
``Uncertain``. Each carries the outcome object (``reason_code``,
``message``, ``retryable``, ``remediation``) and never a remote's text as
its message.
"""

import hashlib
import http.client
import json
import keyword
import os
import socket
import threading

__all__ = [
    "Bridge",
    "BridgeError",
    "ToolError",
    "Denied",
    "Failed",
    "Unavailable",
    "Uncertain",
    "call",
    "tools",
    "call_id",
]


def call_id(script_sha256, ordinal):
    """The bridge's call id for the ``ordinal``-th call of a script."""
    digest = hashlib.sha256(
        script_sha256.encode("ascii") + b"\x00" + str(ordinal).encode("ascii")
    ).hexdigest()
    return "bridge:" + digest[:32]


class BridgeError(Exception):
    """The bridge refused the request itself (token, body, closed turn)."""

    def __init__(self, status, code, message):
        super().__init__("%s (%s): %s" % (code, status, message))
        self.status = status
        self.code = code


class ToolError(Exception):
    """A call that did not succeed; ``outcome`` is the six-field object."""

    def __init__(self, outcome, content):
        super().__init__("%s: %s" % (outcome.get("reason_code"), outcome.get("message")))
        self.outcome = outcome
        self.content = content
        self.reason_code = outcome.get("reason_code")
        self.retryable = outcome.get("retryable")


class Denied(ToolError):
    """Policy, scope or a breaker refused the call; nothing ran."""


class Failed(ToolError):
    """The call ran, or was checked, and failed."""


class Unavailable(ToolError):
    """The tool or its server could not be reached."""


class Uncertain(ToolError):
    """The effect may or may not have happened; it will not be retried."""


_RAISES = {
    "denied": Denied,
    "failed": Failed,
    "unavailable": Unavailable,
    "uncertain": Uncertain,
}


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


class Bridge:
    """One turn's bridge. Calls are serialized: one at a time, in order."""

    def __init__(self, socket_path=None, token=None, timeout=600.0):
        self.socket_path = socket_path or os.environ["TOOLGATE_BRIDGE_SOCKET"]
        self.token = token or os.environ["TOOLGATE_BRIDGE_TOKEN"]
        self.timeout = timeout
        self._lock = threading.Lock()

    def _request(self, method, path, body=None):
        connection = _UnixConnection(self.socket_path, self.timeout)
        try:
            headers = {"Authorization": "Bearer " + self.token}
            payload = None
            if body is not None:
                payload = json.dumps(body).encode("utf-8")
                headers["Content-Type"] = "application/json"
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            data = response.read()
            ordinal = response.getheader("Toolgate-Ordinal")
        finally:
            connection.close()
        parsed = json.loads(data) if data else {}
        if response.status != 200:
            error = parsed.get("error", {})
            raise BridgeError(response.status, error.get("code"), error.get("message"))
        return parsed, ordinal

    def call(self, name, /, **arguments):
        """Calls ``name``; returns its content, or raises per status."""
        with self._lock:
            body, _ = self._request("POST", "/v1/call", {"call": name, "arguments": arguments})
        status = body.get("status")
        content = body.get("content", [])
        if status == "succeeded":
            return content
        outcome = {key: value for key, value in body.items() if key != "content"}
        raise _RAISES.get(status, ToolError)(outcome, content)

    def tools(self):
        """The turn's pinned tools: name, description, input_schema."""
        with self._lock:
            body, _ = self._request("GET", "/v1/tools")
        return body["tools"]


_default = None


def _bridge():
    global _default
    if _default is None:
        _default = Bridge()
    return _default


def call(name, /, **arguments):
    """Calls ``name`` through the turn's bridge (see ``Bridge.call``)."""
    return _bridge().call(name, **arguments)


def tools():
    """The turn's pinned tools (see ``Bridge.tools``)."""
    return _bridge().tools()


def text(content):
    """The text parts of a call's content, joined."""
    return "\n".join(part["text"] for part in content if part.get("type") == "text")


_PY_TYPES = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "boolean": "bool",
    "array": "list",
    "object": "dict",
}


def _identifier(name):
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    if not out or out[0].isdigit():
        out = "t_" + out
    if keyword.iskeyword(out) or keyword.issoftkeyword(out):
        out += "_"
    return out


def generate_stubs(pinned):
    """A Python module with one typed function per pinned tool, so a script
    author sees names and arguments. ``pinned`` is what ``tools()`` returns."""
    lines = [
        '"""Generated from a turn\'s pinned tools by toolgate_bridge; do not edit."""',
        "",
        "from toolgate_bridge import call",
        "",
    ]
    for tool in sorted(pinned, key=lambda t: t["name"]):
        schema = tool.get("input_schema") or {}
        properties = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        parameters = []
        passed = []
        for name in sorted(properties, key=lambda n: (n not in required, n)):
            kind = properties[name].get("type") if isinstance(properties[name], dict) else None
            annotation = _PY_TYPES.get(kind, "object") if isinstance(kind, str) else "object"
            python_name = _identifier(name)
            if name in required:
                parameters.append("%s: %s" % (python_name, annotation))
            else:
                parameters.append("%s: %s = None" % (python_name, annotation))
            passed.append((name, python_name, name in required))
        signature = ", ".join(["*"] + parameters) if parameters else ""
        lines.append("")
        lines.append("def %s(%s) -> list:" % (_identifier(tool["name"]), signature))
        # A server's description is untrusted text: written as a repr,
        # never spliced into source.
        description = (tool.get("description") or "").strip()
        lines.append("    %r" % (description.splitlines()[0] if description else tool["name"]))
        lines.append("    arguments = {}")
        for name, python_name, is_required in passed:
            if is_required:
                lines.append("    arguments[%r] = %s" % (name, python_name))
            else:
                lines.append("    if %s is not None:" % python_name)
                lines.append("        arguments[%r] = %s" % (name, python_name))
        lines.append("    return call(%r, **arguments)" % tool["name"])
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["stubs"]:
        sys.stdout.write(generate_stubs(tools()))
    elif sys.argv[1:] == ["tools"]:
        json.dump(tools(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stderr.write("usage: toolgate_bridge.py stubs|tools\n")
        sys.exit(2)
