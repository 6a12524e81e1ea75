// Unit tests of the Node client that need no toolgate: the call-id rule
// against the shared vectors, results as values, and the declarations
// generator against hostile names and descriptions. Run: node --test.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import test from "node:test";

import {
  Bridge, BridgeError, Failed, Result, callId, generateDeclarations, generateModule, text,
} from "./toolgate_bridge.mjs";

const vectors = JSON.parse(readFileSync(new URL("../call_id_vectors.json", import.meta.url), "utf8"));

test("call ids follow the shared vectors, from ordinal 0", () => {
  assert.equal(Math.min(...vectors.map((vector) => vector.ordinal)), 0);
  for (const vector of vectors) assert.equal(callId(vector.script_sha256, vector.ordinal), vector.call_id);
});

test("only the two unsettled codes say ask again", () => {
  const error = (code, retryable) => new Failed({ status: "failed", reason_code: code, retryable }, []);
  assert.equal(error("tool.concurrency_conflict", true).unsettled, true);
  assert.equal(error("tool.record_unavailable", true).unsettled, true);
  // Retryable, but settled: asking again is a second call.
  assert.equal(error("tool.timeout", true).unsettled, false);
  assert.equal(error("tool.outcome_unknown", false).unsettled, false);
});

test("a value is the structured result, else the text", () => {
  const structured = new Result("mcp.w.weather", { content: [], structured: { temperature: 21.5 }, artifacts: [] });
  assert.deepEqual(structured.value(), { temperature: 21.5 });
  const plain = new Result("demo.echo", {
    content: [{ type: "text", text: "a", trust: "internal_tool" },
      { type: "artifact", artifact_id: "x", media_type: "image/png", bytes: 3, trust: "external_untrusted" },
      { type: "text", text: "b", trust: "internal_tool" }],
    structured: null, artifacts: [],
  });
  assert.equal(plain.value(), "a\nb");
  assert.equal(text(plain), "a\nb");
});

test("hostile names and descriptions stay data", () => {
  const hostile = "*/ export const pwned = 1; /*";
  const pinned = [
    { name: "mcp.evil.c-d", description: hostile, input_schema: { type: "object", properties: { [hostile]: { type: "string" } } } },
    { name: "mcp.evil.c_d", description: "", input_schema: {} },
    { name: "delete", description: "line one\nline two */", input_schema: {},
      output_schema: { type: "object", properties: { "a\"b": { enum: ["x", 1] } }, required: ["a\"b"] } },
  ];
  const declarations = generateDeclarations(pinned);
  // The description stays in its comment, the key in its string.
  assert.ok(declarations.includes("/** *\\/ export const pwned = 1; /* */"), declarations);
  assert.ok(declarations.includes('{ "*/ export const pwned = 1; /*"?: string }'), declarations);
  assert.equal(declarations.split("\n").filter((line) => line.startsWith("export const")).length, 0);
  assert.ok(declarations.includes("export declare function mcp_evil_c_d("), declarations);
  assert.ok(declarations.includes("export declare function mcp_evil_c_d_2("), declarations);
  assert.ok(declarations.includes("export declare function delete_("), declarations);
  assert.ok(declarations.includes('export type delete__result = { "a\\"b": "x" | 1 };'), declarations);
  const module = generateModule(pinned);
  assert.ok(module.includes('call("mcp.evil.c-d", input)'), module);
});

test("a call whose connection fails is not sent again", async () => {
  const bridge = new Bridge({ socketPath: "/nonexistent/socket", token: "t" });
  await assert.rejects(bridge.call("demo.echo", { text: "x" }),
    (error) => error instanceof BridgeError && error.code === "connection_lost");
});
