"""Unit tests of the bridge client that need no toolgate: the call-id rule
against the shared vectors, and stub generation. The end-to-end tests
(tests/it/serve.rs) run the client against a real toolgate."""

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
        for vector in vectors:
            self.assertEqual(
                toolgate_bridge.call_id(vector["script_sha256"], vector["ordinal"]),
                vector["call_id"],
            )


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
        ]
        source = toolgate_bridge.generate_stubs(pinned)
        self.assertIn("def demo_echo(*, text: str, times: int = None) -> list:", source)
        self.assertIn("def mcp_everything_get_sum() -> list:", source)
        namespace = {}
        exec(compile(source, "stubs", "exec"), namespace)
        self.assertTrue(callable(namespace["demo_echo"]))

    def test_hostile_descriptions_and_names_stay_data(self):
        hostile = "';__import__('os').system('echo INJECTED')#" + '"' * 3
        pinned = [
            {"name": "mcp.evil.a", "description": "ends in a backslash \\", "input_schema": {}},
            {"name": "mcp.evil.b", "description": hostile,
             "input_schema": {"type": "object", "properties": {"from": {"type": "string"},
                                                              "name": {"type": "string"}}}},
        ]
        source = toolgate_bridge.generate_stubs(pinned)
        namespace = {}
        exec(compile(source, "stubs", "exec"), namespace)
        self.assertEqual(namespace["mcp_evil_b"].__doc__, hostile)
        self.assertIn("def mcp_evil_b(*, from_: str = None, name: str = None) -> list:", source)

    def test_a_tool_argument_may_be_called_name(self):
        bridge = toolgate_bridge.Bridge(socket_path="/nonexistent", token="t")
        with self.assertRaises(OSError):
            bridge.call("tool.call", name="demo.echo", arguments={})


if __name__ == "__main__":
    unittest.main()
