"""The in-sandbox client for toolgate's orchestration bridge.

Standard library only. Reads the turn's socket path and token from the
environment (``TOOLGATE_BRIDGE_SOCKET``, ``TOOLGATE_BRIDGE_TOKEN``), keeps one
connection per turn, and makes calls one at a time so the bridge's ordinals,
and with them the call ids a replayed script deduplicates on, stay
deterministic.

    from toolgate_bridge import call
    weather = call("mcp.weather.now", city="Lisbon")   # a value
    print(weather["temperature"])

``call`` returns a value: the result's ``structured`` value when the tool
gives one, else its text. ``call_result`` returns the whole ``Result``
(content blocks, structured value, artifacts, each with its trust label).
A call that did not succeed raises one typed exception per status:
``Denied``, ``Failed``, ``Unavailable``, ``Uncertain``; each carries the
outcome object (``reason_code``, ``message``, ``retryable``, ``remediation``)
and never a remote's text as its message. A tool that acts with the user's
own account at a server they have not granted raises ``ConsentRequired``
(an ``Unavailable``) with the ``url`` of toolgate's consent page; nothing
ran, and the same call made again once they have consented runs. ``artifact`` reads an artifact's
bytes (a large output, an image) in full.
"""

from __future__ import annotations

import builtins
import hashlib
import http.client
import json
import keyword
import os
import socket
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

__all__ = [
    "Bridge",
    "BridgeError",
    "ToolError",
    "Denied",
    "Failed",
    "Unavailable",
    "Uncertain",
    "ConsentRequired",
    "Result",
    "call",
    "call_result",
    "artifact",
    "tools",
    "text",
    "call_id",
    "generate_stubs",
]

#: A kept connection idle longer than this is replaced before a request:
#: the bridge closes idle connections (after 10 s by default), and a request
#: on a connection it has closed could not be told from one it received.
IDLE_REUSE_SECONDS = 2.0
# A call unanswered this long is asked about: a call held for an approval
# is told on standard error, so a blocked script says why.
WAIT_NOTICE_SECONDS = 2.0


def call_id(script_sha256: str, ordinal: int) -> str:
    """The bridge's call id for the ``ordinal``-th call of a script
    (ordinals start at 0)."""
    digest = hashlib.sha256(
        script_sha256.encode("ascii") + b"\x00" + str(ordinal).encode("ascii")
    ).hexdigest()
    return "bridge:" + digest[:32]


#: The two reason codes that leave a call without a settled outcome: asked
#: again in the same turn it is the same call, never a second one.
UNSETTLED = (
    "tool.concurrency_conflict",
    "tool.record_unavailable",
    "tool.rate_limited",
    "tool.consent_required",
)


class BridgeError(Exception):
    """The bridge refused the request itself (token, body, closed turn), or
    the connection failed while a call was in flight."""

    def __init__(self, status: int, code: Optional[str], message: Optional[str]) -> None:
        super().__init__("%s (%s): %s" % (code, status, message))
        self.status = status
        self.code = code


class ToolError(Exception):
    """A call that did not succeed; ``outcome`` is the six-field object."""

    def __init__(self, outcome: Dict[str, Any], content: List[Dict[str, Any]]) -> None:
        super().__init__("%s: %s" % (outcome.get("reason_code"), outcome.get("message")))
        self.outcome = outcome
        self.content = content
        self.reason_code: Optional[str] = outcome.get("reason_code")
        self.retryable: Optional[bool] = outcome.get("retryable")
        # The call has no settled outcome yet; calling it again in the same
        # turn is the same call (the bridge gave its ordinal back).
        self.unsettled: bool = self.reason_code in UNSETTLED


class Denied(ToolError):
    """Policy, scope or a breaker refused the call; nothing ran."""


class Failed(ToolError):
    """The call ran, or was checked, and failed."""


class Unavailable(ToolError):
    """The tool or its server could not be reached."""


class Uncertain(ToolError):
    """The effect may or may not have happened; it will not be retried."""


class ConsentRequired(Unavailable):
    """The tool acts with the user's own account at ``server_id``, which they
    have not granted: nothing ran. ``url`` is toolgate's consent page for it;
    the same call made again once they have consented runs."""

    def __init__(
        self, outcome: Dict[str, Any], content: List[Dict[str, Any]], consent: Dict[str, Any]
    ) -> None:
        super().__init__(outcome, content)
        self.server_id: Optional[str] = consent.get("server_id")
        self.url: Optional[str] = consent.get("url")


_RAISES = {
    "denied": Denied,
    "failed": Failed,
    "unavailable": Unavailable,
    "uncertain": Uncertain,
}


class Result:
    """A succeeded call's result as data."""

    def __init__(self, action: str, result: Dict[str, Any]) -> None:
        self.action = action
        #: Blocks in order: ``{"type": "text", "text", "trust"}`` or
        #: ``{"type": "artifact", "artifact_id", "media_type", "bytes", "trust"}``.
        self.content: List[Dict[str, Any]] = list(result.get("content") or [])
        #: The tool's structured result, when it gives one.
        self.structured: Any = result.get("structured")
        #: Every artifact the call produced.
        self.artifacts: List[Dict[str, Any]] = list(result.get("artifacts") or [])

    @property
    def text(self) -> str:
        """The text blocks, joined."""
        return text(self.content)

    def value(self) -> Any:
        """The structured value when there is one, else the text."""
        return self.structured if self.structured is not None else self.text

    def __repr__(self) -> str:
        return "Result(action=%r, structured=%r, content=%r)" % (
            self.action,
            self.structured,
            self.content,
        )


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


class Bridge:
    """One turn's bridge: one kept connection, calls one at a time, in order."""

    def __init__(
        self,
        socket_path: Optional[str] = None,
        token: Optional[str] = None,
        timeout: float = 600.0,
    ) -> None:
        self.socket_path = socket_path or os.environ["TOOLGATE_BRIDGE_SOCKET"]
        self.token = token or os.environ["TOOLGATE_BRIDGE_TOKEN"]
        self.timeout = timeout
        self._lock = threading.Lock()
        self._connection: Optional[_UnixConnection] = None
        self._last_used = 0.0

    def close(self) -> None:
        """Closes the kept connection."""
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _exchange(
        self, method: str, path: str, body: Optional[Dict[str, Any]]
    ) -> Tuple[int, bytes, Optional[str]]:
        if self._connection is not None and time.monotonic() - self._last_used > IDLE_REUSE_SECONDS:
            self._drop()
        if self._connection is None:
            self._connection = _UnixConnection(self.socket_path, self.timeout)
        headers = {"Authorization": "Bearer " + self.token}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        try:
            self._connection.request(method, path, body=payload, headers=headers)
            response = self._connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as failure:
            # A call may have reached the bridge: it is never sent again
            # (a second send would be a second call, with a new ordinal).
            self._drop()
            raise BridgeError(0, "connection_lost", str(failure)) from None
        self._last_used = time.monotonic()
        if response.will_close:
            self._drop()
        return response.status, data, response.getheader("Toolgate-Ordinal")

    def _request(
        self, method: str, path: str, body: Optional[Dict[str, Any]] = None
    ) -> Tuple[Any, Optional[str]]:
        status, data, ordinal = self._exchange(method, path, body)
        parsed = json.loads(data) if data else {}
        if status != 200:
            error = parsed.get("error", {}) if isinstance(parsed, dict) else {}
            raise BridgeError(status, error.get("code"), error.get("message"))
        return parsed, ordinal

    def _tell_waiting(self) -> None:
        """Asks the turn what its call in flight waits for, on a second
        connection, and says so on standard error when it is an approval."""
        connection = _UnixConnection(self.socket_path, 10.0)
        try:
            connection.request("GET", "/v1/waiting", headers={"Authorization": "Bearer " + self.token})
            response = connection.getresponse()
            waiting = json.loads(response.read() or b"{}").get("waiting") if response.status == 200 else None
        except (OSError, http.client.HTTPException, ValueError):
            return
        finally:
            connection.close()
        if isinstance(waiting, dict):
            sys.stderr.write(
                "toolgate: the call to {} waits for a human's approval ({}); this script blocks "
                "for up to {} s more (until {}), then its turn is suspended\n".format(
                    waiting.get("call"), waiting.get("approval_id"),
                    waiting.get("seconds_left"), waiting.get("held_until"),
                )
            )
            sys.stderr.flush()

    def call_result(self, name: str, /, **arguments: Any) -> Result:
        """Calls ``name``; returns its ``Result``, or raises per status."""
        notice = threading.Timer(WAIT_NOTICE_SECONDS, self._tell_waiting)
        notice.daemon = True
        with self._lock:
            notice.start()
            try:
                body, _ = self._request("POST", "/v1/call", {"call": name, "arguments": arguments})
            finally:
                notice.cancel()
        status = body.get("status")
        if status == "succeeded":
            return Result(body.get("action", name), body.get("result") or {})
        outcome = {key: value for key, value in body.items() if key not in ("content", "consent")}
        if isinstance(body.get("consent"), dict):
            raise ConsentRequired(outcome, body.get("content", []), body["consent"])
        raise _RAISES.get(status, ToolError)(outcome, body.get("content", []))

    def call(self, name: str, /, **arguments: Any) -> Any:
        """Calls ``name``; returns its structured value, else its text."""
        return self.call_result(name, **arguments).value()

    def artifact(self, artifact_id: str) -> bytes:
        """An artifact's bytes, in full (the turn's tenant's only)."""
        with self._lock:
            status, data, _ = self._exchange("GET", "/v1/artifacts/" + artifact_id, None)
        if status != 200:
            parsed = json.loads(data) if data else {}
            error = parsed.get("error", {}) if isinstance(parsed, dict) else {}
            raise BridgeError(status, error.get("code"), error.get("message"))
        return data

    def tools(self) -> List[Dict[str, Any]]:
        """The turn's pinned tools: name, description, input and output schema."""
        with self._lock:
            body, _ = self._request("GET", "/v1/tools")
        tools: List[Dict[str, Any]] = body["tools"]
        return tools


_default: Optional[Bridge] = None


def _bridge() -> Bridge:
    global _default
    if _default is None:
        _default = Bridge()
    return _default


def call(name: str, /, **arguments: Any) -> Any:
    """Calls ``name`` through the turn's bridge (see ``Bridge.call``)."""
    return _bridge().call(name, **arguments)


def call_result(name: str, /, **arguments: Any) -> Result:
    """Calls ``name``; the whole result (see ``Bridge.call_result``)."""
    return _bridge().call_result(name, **arguments)


def artifact(artifact_id: str) -> bytes:
    """An artifact's bytes (see ``Bridge.artifact``)."""
    return _bridge().artifact(artifact_id)


def tools() -> List[Dict[str, Any]]:
    """The turn's pinned tools (see ``Bridge.tools``)."""
    return _bridge().tools()


def text(content: Any) -> str:
    """The text of a value: a string as it is, a ``Result``'s text, or the
    text blocks of a content list, joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, Result):
        return content.text
    return "\n".join(
        part["text"] for part in content if isinstance(part, dict) and part.get("type") == "text"
    )


# --- typed stubs ----------------------------------------------------------

_SCALARS = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "null": "None"}


def _identifier(name: str, taken: set[str]) -> str:
    """A Python identifier for ``name``, not in ``taken`` (then taken)."""
    out = "".join(c if (c.isascii() and c.isalnum()) or c == "_" else "_" for c in name)
    if not out or out[0].isdigit():
        out = "t_" + out
    if keyword.iskeyword(out) or keyword.issoftkeyword(out) or out in dir(builtins):
        out += "_"
    candidate, suffix = out, 2
    while candidate in taken:
        candidate = "%s_%d" % (out, suffix)
        suffix += 1
    taken.add(candidate)
    return candidate


def _type_of(schema: Any) -> str:
    """A Python type for a JSON schema; ``Any`` where it says too little."""
    if not isinstance(schema, dict):
        return "Any"
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and all(
        isinstance(value, (str, int)) and not isinstance(value, bool) for value in enum
    ):
        return "Literal[%s]" % ", ".join(repr(value) for value in enum)
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [_type_of(dict(schema, type=one)) for one in kind if isinstance(one, str)]
        return " | ".join(sorted(set(kinds))) if kinds else "Any"
    if kind in _SCALARS:
        return _SCALARS[kind]
    if kind == "array":
        return "list[%s]" % _type_of(schema.get("items"))
    if kind == "object":
        return "dict[str, Any]"
    return "Any"


def generate_stubs(pinned: List[Dict[str, Any]]) -> str:
    """A Python module with one typed function per pinned tool: keyword
    arguments typed from the input schema, the return typed from the output
    schema (a ``TypedDict``) where the tool declares one. Names and
    descriptions are the server's text, so they only ever appear as string
    literals or as sanitized identifiers, never spliced into code."""
    lines = [
        '"""Generated from a turn\'s pinned tools by toolgate_bridge; do not edit."""',
        "",
        "from typing import Any, Literal, NotRequired, TypedDict",
        "",
        "from toolgate_bridge import call",
        "",
    ]
    taken: set[str] = {"Any", "Literal", "NotRequired", "TypedDict", "call"}
    for tool in sorted(pinned, key=lambda t: str(t.get("name"))):
        name = str(tool.get("name"))
        function = _identifier(name, taken)
        output = tool.get("output_schema")
        returns = "Any"
        if isinstance(output, dict) and output.get("type") == "object":
            returns = _identifier(function + "_result", taken)
            required = set(output.get("required") or [])
            fields = []
            for key, field in sorted((output.get("properties") or {}).items()):
                kind = _type_of(field)
                if key not in required:
                    kind = "NotRequired[%s]" % kind
                fields.append("%r: %s" % (str(key), kind))
            lines.append("")
            lines.append("%s = TypedDict(%r, {%s})" % (returns, returns, ", ".join(fields)))
        schema = tool.get("input_schema") or {}
        properties = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        parameters = []
        passed = []
        names: set[str] = {"arguments"}
        for key in sorted(properties, key=lambda n: (n not in required, n)):
            python_name = _identifier(str(key), names)
            kind = _type_of(properties[key])
            if key in required:
                parameters.append("%s: %s" % (python_name, kind))
            else:
                parameters.append("%s: %s | None = None" % (python_name, kind))
            passed.append((str(key), python_name, key in required))
        signature = ", ".join(["*"] + parameters) if parameters else ""
        lines.append("")
        lines.append("")
        lines.append("def %s(%s) -> %s:" % (function, signature, returns))
        description = str(tool.get("description") or "").strip()
        lines.append("    %r" % (description.splitlines()[0] if description else name))
        lines.append("    arguments: dict[str, Any] = {}")
        for key, python_name, is_required in passed:
            if is_required:
                lines.append("    arguments[%r] = %s" % (key, python_name))
            else:
                lines.append("    if %s is not None:" % python_name)
                lines.append("        arguments[%r] = %s" % (key, python_name))
        if returns == "Any":
            lines.append("    return call(%r, **arguments)" % name)
        else:
            lines.append("    value: %s = call(%r, **arguments)" % (returns, name))
            lines.append("    return value")
    lines.append("")
    return "\n".join(lines)


def main(argv: List[str]) -> int:
    if argv == ["stubs"]:
        sys.stdout.write(generate_stubs(tools()))
    elif argv == ["tools"]:
        json.dump(tools(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stderr.write("usage: toolgate_bridge.py stubs|tools\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
