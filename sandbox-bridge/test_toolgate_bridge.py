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


if __name__ == "__main__":
    unittest.main()
