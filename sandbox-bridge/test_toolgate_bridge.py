"""Unit tests of the bridge client that need no toolgate: the call-id rule
against the shared vectors, results as values, and stub generation. The
end-to-end tests (tests/it/serve.rs) run the client against a real
toolgate."""

import json
import os
import unittest

import toolgate_bridge

HERE = os.path.dirname(os.path.abspath(__file__))


class CallIds(unittest.TestCase):
    def test_vectors(self):
        with open(os.path.join(HERE, "call_id_vectors.json")) as handle:
            vectors = json.load(handle)
        self.assertGreater(len(vectors), 0)
        self.assertEqual(min(vector["ordinal"] for vector in vectors), 0)
        for vector in vectors:
            self.assertEqual(
                toolgate_bridge.call_id(vector["script_sha256"], vector["ordinal"]),
                vector["call_id"],
            )


class Unsettled(unittest.TestCase):
    def test_only_the_two_unsettled_codes_say_ask_again(self):
        def error(code, retryable):
            return toolgate_bridge.Failed(
                {"status": "failed", "reason_code": code, "retryable": retryable}, []
            )

        self.assertTrue(error("tool.concurrency_conflict", True).unsettled)
        self.assertTrue(error("tool.record_unavailable", True).unsettled)
        # Retryable, but settled: asking again is a second call.
        self.assertFalse(error("tool.timeout", True).unsettled)
        self.assertFalse(error("tool.outcome_unknown", False).unsettled)


class Results(unittest.TestCase):
    def test_a_value_is_the_structured_result_else_the_text(self):
        structured = toolgate_bridge.Result(
            "mcp.w.weather",
            {"content": [{"type": "text", "text": "{}", "trust": "external_untrusted"}],
             "structured": {"temperature": 21.5}, "artifacts": []},
        )
        self.assertEqual(structured.value(), {"temperature": 21.5})
        plain = toolgate_bridge.Result(
            "demo.echo",
            {"content": [{"type": "text", "text": "a", "trust": "internal_tool"},
                         {"type": "artifact", "artifact_id": "x", "media_type": "image/png",
                          "bytes": 3, "trust": "external_untrusted"},
                         {"type": "text", "text": "b", "trust": "internal_tool"}],
             "structured": None, "artifacts": []},
        )
        self.assertEqual(plain.value(), "a\nb")
        self.assertEqual(toolgate_bridge.text(plain), "a\nb")
        self.assertEqual(toolgate_bridge.text("as is"), "as is")


class Stubs(unittest.TestCase):
    def test_one_typed_function_per_tool(self):
        pinned = [
            {
                "name": "demo.echo",
                "description": "Echoes text.",
                "input_schema": {
                    "type": "object",
                    "properties": {"text": {"type": "string"}, "times": {"type": "integer"}},
                    "required": ["text"],
                },
            },
            {"name": "mcp.everything.get-sum", "description": "", "input_schema": {}},
            {
                "name": "mcp.w.weather",
                "description": "Weather.",
                "input_schema": {"type": "object", "properties": {
                    "city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}},
                "output_schema": {"type": "object", "properties": {
                    "temperature": {"type": "number"}, "tags": {"type": "array", "items": {"type": "string"}}},
                    "required": ["temperature"]},
            },
        ]
        source = toolgate_bridge.generate_stubs(pinned)
        self.assertIn("def demo_echo(*, text: str, times: int | None = None) -> Any:", source)
        self.assertIn("def mcp_everything_get_sum() -> Any:", source)
        self.assertIn(
            "mcp_w_weather_result = TypedDict('mcp_w_weather_result', "
            "{'tags': NotRequired[list[str]], 'temperature': float})",
            source,
        )
        self.assertIn(
            "def mcp_w_weather(*, city: str | None = None, unit: Literal['c', 'f'] | None = None)"
            " -> mcp_w_weather_result:",
            source,
        )
        namespace = {}
        exec(compile(source, "stubs", "exec"), namespace)
        self.assertTrue(callable(namespace["demo_echo"]))

    def test_hostile_descriptions_and_names_stay_data(self):
        hostile = "';__import__('os').system('echo INJECTED')#" + '"' * 3
        pinned = [
            {"name": "mcp.evil.a", "description": "ends in a backslash \\", "input_schema": {}},
            {"name": "mcp.evil.b", "description": hostile,
             "input_schema": {"type": "object", "properties": {"from": {"type": "string"},
                                                              "name": {"type": "string"}}},
             "output_schema": {"type": "object", "properties": {hostile: {"type": "string"}}}},
            # Names that sanitize alike, or to a builtin, stay apart.
            {"name": "mcp.evil.c-d", "description": "", "input_schema": {}},
            {"name": "mcp.evil.c_d", "description": "", "input_schema": {}},
            {"name": "str", "description": "", "input_schema": {}},
        ]
        source = toolgate_bridge.generate_stubs(pinned)
        namespace = {}
        exec(compile(source, "stubs", "exec"), namespace)
        self.assertEqual(namespace["mcp_evil_b"].__doc__, hostile)
        self.assertIn("def mcp_evil_b(*, from_: str | None = None, name: str | None = None)", source)
        self.assertIn("def mcp_evil_c_d() -> Any:", source)
        self.assertIn("def mcp_evil_c_d_2() -> Any:", source)
        self.assertIn("def str_() -> Any:", source)
        self.assertNotIn("INJECTED')\n", source.replace(repr(hostile), ""))

    def test_a_tool_argument_may_be_called_name(self):
        bridge = toolgate_bridge.Bridge(socket_path="/nonexistent", token="t")
        with self.assertRaises(toolgate_bridge.BridgeError) as raised:
            bridge.call("tool.call", name="demo.echo", arguments={})
        self.assertEqual(raised.exception.code, "connection_lost")


if __name__ == "__main__":
    unittest.main()
