// The in-sandbox client for toolgate's orchestration bridge, for Node 18+.
//
// Node's standard library only. Reads the turn's socket path and token from
// the environment (TOOLGATE_BRIDGE_SOCKET, TOOLGATE_BRIDGE_TOKEN), keeps one
// connection per turn, and makes calls one at a time, in the order they are
// made, so the bridge's ordinals, and with them the call ids a replayed
// script deduplicates on, stay deterministic.
//
//   import { call } from "./toolgate_bridge.mjs";
//   const weather = await call("mcp.weather.now", { city: "Lisbon" });
//   console.log(weather.temperature);
//
// `call` resolves to a value: the result's `structured` value when the tool
// gives one, else its text. `callResult` resolves to the whole result
// (content blocks, structured value, artifacts, each with its trust label).
// A call that did not succeed rejects with one typed error per status:
// Denied, Failed, Unavailable, Uncertain, each carrying the outcome object
// and never a remote's text as its message. `artifact` reads an artifact's
// bytes in full.

import { createHash } from "node:crypto";
import http from "node:http";
import process from "node:process";
import { pathToFileURL } from "node:url";

/** A kept connection idle longer than this is replaced before a request. */
export const IDLE_REUSE_MS = 2000;
// A call unanswered this long is asked about: a call held for an approval
// is told on standard error, so a blocked script says why.
const WAIT_NOTICE_MS = 2000;

/** The bridge's call id for the `ordinal`-th call (from 0) of a script. */
export function callId(scriptSha256, ordinal) {
  const digest = createHash("sha256")
    .update(Buffer.concat([Buffer.from(scriptSha256, "ascii"), Buffer.from([0]),
      Buffer.from(String(ordinal), "ascii")]))
    .digest("hex");
  return "bridge:" + digest.slice(0, 32);
}

/** The bridge refused the request itself, or the connection failed. */
export class BridgeError extends Error {
  constructor(status, code, message) {
    super(`${code} (${status}): ${message}`);
    this.name = "BridgeError";
    this.status = status;
    this.code = code;
  }
}

/** The reason codes that leave a call without a settled outcome. */
export const UNSETTLED = [
  "tool.concurrency_conflict",
  "tool.record_unavailable",
  "tool.rate_limited",
  "tool.consent_required",
];

/** A call that did not succeed; `outcome` is the six-field object. */
export class ToolError extends Error {
  constructor(outcome, content) {
    super(`${outcome.reason_code}: ${outcome.message}`);
    this.name = new.target.name;
    this.outcome = outcome;
    this.content = content;
    this.reasonCode = outcome.reason_code;
    this.retryable = outcome.retryable;
    // No settled outcome yet: calling it again in the same turn is the same
    // call (the bridge gave its ordinal back).
    this.unsettled = UNSETTLED.includes(outcome.reason_code);
  }
}
/** Policy, scope or a breaker refused the call; nothing ran. */
export class Denied extends ToolError {}
/** The call ran, or was checked, and failed. */
export class Failed extends ToolError {}
/** The tool or its server could not be reached. */
export class Unavailable extends ToolError {}
/** The effect may or may not have happened; it will not be retried. */
export class Uncertain extends ToolError {}
/**
 * The tool acts with the user's own account at `serverId`, which they have
 * not granted: nothing ran. `url` is toolgate's consent page; the same call
 * made again once they have consented runs.
 */
export class ConsentRequired extends Unavailable {
  constructor(outcome, content, consent) {
    super(outcome, content);
    this.serverId = consent.server_id;
    this.url = consent.url;
  }
}

const RAISES = { denied: Denied, failed: Failed, unavailable: Unavailable, uncertain: Uncertain };

/** The text of a value: a string as it is, a result's text blocks joined. */
export function text(value) {
  if (typeof value === "string") return value;
  const content = Array.isArray(value) ? value : (value && value.content) || [];
  return content.filter((part) => part && part.type === "text").map((part) => part.text).join("\n");
}

/** A succeeded call's result as data. */
export class Result {
  constructor(action, result) {
    this.action = action;
    this.content = result.content || [];
    this.structured = result.structured ?? null;
    this.artifacts = result.artifacts || [];
  }
  get text() {
    return text(this.content);
  }
  value() {
    return this.structured !== null ? this.structured : this.text;
  }
}

/** One turn's bridge: one kept connection, calls one at a time, in order. */
export class Bridge {
  constructor({ socketPath, token, timeoutMs = 600000 } = {}) {
    this.socketPath = socketPath || process.env.TOOLGATE_BRIDGE_SOCKET;
    this.token = token || process.env.TOOLGATE_BRIDGE_TOKEN;
    this.timeoutMs = timeoutMs;
    this.agent = null;
    this.lastUsed = 0;
    this.queue = Promise.resolve();
  }

  close() {
    if (this.agent) this.agent.destroy();
    this.agent = null;
  }

  // Requests run one after another, whatever the script awaits.
  serialized(work) {
    const next = this.queue.then(work, work);
    this.queue = next.catch(() => {});
    return next;
  }

  exchange(method, path, body) {
    if (this.agent && Date.now() - this.lastUsed > IDLE_REUSE_MS) this.close();
    if (!this.agent) this.agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    const payload = body === undefined ? null : Buffer.from(JSON.stringify(body), "utf8");
    const headers = { Authorization: "Bearer " + this.token };
    if (payload) {
      headers["Content-Type"] = "application/json";
      headers["Content-Length"] = String(payload.length);
    }
    return new Promise((resolve, reject) => {
      const request = http.request(
        { socketPath: this.socketPath, path, method, headers, agent: this.agent, timeout: this.timeoutMs },
        (response) => {
          const chunks = [];
          response.on("data", (chunk) => chunks.push(chunk));
          response.on("end", () => {
            this.lastUsed = Date.now();
            resolve({ status: response.statusCode, data: Buffer.concat(chunks) });
          });
          response.on("error", (error) => fail(error));
        },
      );
      // A call may have reached the bridge: it is never sent again (a
      // second send would be a second call, with a new ordinal).
      const fail = (error) => {
        this.close();
        reject(new BridgeError(0, "connection_lost", error.message));
      };
      request.on("timeout", () => request.destroy(new Error("timed out")));
      request.on("error", fail);
      request.end(payload || undefined);
    });
  }

  async request(method, path, body) {
    const { status, data } = await this.exchange(method, path, body);
    const parsed = data.length ? JSON.parse(data.toString("utf8")) : {};
    if (status !== 200) {
      const error = (parsed && parsed.error) || {};
      throw new BridgeError(status, error.code, error.message);
    }
    return parsed;
  }

  /** Asks the turn, on a connection of its own, what its call in flight
   * waits for; says so on standard error when it is an approval. */
  tellWaiting() {
    const request = http.request(
      { socketPath: this.socketPath, path: "/v1/waiting", method: "GET", agent: false, timeout: 10000,
        headers: { Authorization: "Bearer " + this.token } },
      (response) => {
        const chunks = [];
        response.on("data", (chunk) => chunks.push(chunk));
        response.on("end", () => {
          let waiting = null;
          try {
            waiting = response.statusCode === 200 ? JSON.parse(Buffer.concat(chunks).toString("utf8")).waiting : null;
          } catch {
            // not JSON: nothing to tell
          }
          if (waiting) {
            process.stderr.write(
              `toolgate: the call to ${waiting.call} waits for a human's approval (${waiting.approval_id}); ` +
                `this script blocks for up to ${waiting.seconds_left} s more (until ${waiting.held_until}), ` +
                "then its turn is suspended\n",
            );
          }
        });
        response.on("error", () => {});
      },
    );
    request.on("timeout", () => request.destroy());
    request.on("error", () => {});
    request.end();
  }

  /** Calls `name`; resolves to its Result, or rejects per status. */
  callResult(name, args = {}) {
    return this.serialized(async () => {
      const notice = setTimeout(() => this.tellWaiting(), WAIT_NOTICE_MS);
      // The timer alone never keeps a finished script alive.
      notice.unref();
      let body;
      try {
        body = await this.request("POST", "/v1/call", { call: name, arguments: args });
      } finally {
        clearTimeout(notice);
      }
      if (body.status === "succeeded") return new Result(body.action || name, body.result || {});
      const { content = [], consent, ...outcome } = body;
      if (consent && typeof consent === "object") throw new ConsentRequired(outcome, content, consent);
      const Raised = RAISES[body.status] || ToolError;
      throw new Raised(outcome, content);
    });
  }

  /** Calls `name`; resolves to its structured value, else its text. */
  async call(name, args = {}) {
    return (await this.callResult(name, args)).value();
  }

  /** An artifact's bytes, in full (the turn's tenant's only). */
  artifact(artifactId) {
    return this.serialized(async () => {
      const { status, data } = await this.exchange("GET", "/v1/artifacts/" + encodeURIComponent(artifactId));
      if (status !== 200) {
        let error = {};
        try {
          error = JSON.parse(data.toString("utf8")).error || {};
        } catch {
          // not JSON: the status says enough
        }
        throw new BridgeError(status, error.code, error.message);
      }
      return data;
    });
  }

  /** The turn's pinned tools: name, description, input and output schema. */
  tools() {
    return this.serialized(async () => (await this.request("GET", "/v1/tools")).tools);
  }
}

let defaultBridge = null;
function bridge() {
  if (!defaultBridge) defaultBridge = new Bridge();
  return defaultBridge;
}

/** Calls `name` through the turn's bridge (see Bridge.call). */
export function call(name, args = {}) {
  return bridge().call(name, args);
}
/** Calls `name`; the whole result (see Bridge.callResult). */
export function callResult(name, args = {}) {
  return bridge().callResult(name, args);
}
/** An artifact's bytes (see Bridge.artifact). */
export function artifact(artifactId) {
  return bridge().artifact(artifactId);
}
/** The turn's pinned tools (see Bridge.tools). */
export function tools() {
  return bridge().tools();
}
/** Closes the turn's kept connection, so the process can exit. */
export function close() {
  if (defaultBridge) defaultBridge.close();
}

// --- typed declarations ---------------------------------------------------

const RESERVED = new Set(("break case catch class const continue debugger default delete do else enum " +
  "export extends false finally for function if import in instanceof new null return super switch this " +
  "throw true try typeof var void while with as implements interface let package private protected " +
  "public static yield any boolean constructor declare get module require number set string symbol type " +
  "from of unknown never object bigint undefined await async call callResult").split(" "));

function identifier(name, taken) {
  let out = String(name).replace(/[^A-Za-z0-9_]/g, "_");
  if (!out || /^[0-9]/.test(out)) out = "t_" + out;
  if (RESERVED.has(out)) out += "_";
  let candidate = out;
  for (let suffix = 2; taken.has(candidate); suffix += 1) candidate = `${out}_${suffix}`;
  taken.add(candidate);
  return candidate;
}

// A schema's TypeScript type; `unknown` where it says too little. Keys and
// literals are JSON strings, so a server's text is never code.
function typeOf(schema, depth = 0) {
  if (!schema || typeof schema !== "object" || depth > 8) return "unknown";
  if (Array.isArray(schema.enum) && schema.enum.length &&
      schema.enum.every((value) => typeof value === "string" || (typeof value === "number" && Number.isFinite(value)))) {
    return schema.enum.map((value) => JSON.stringify(value)).join(" | ");
  }
  const kind = schema.type;
  if (Array.isArray(kind)) {
    const kinds = kind.filter((one) => typeof one === "string").map((one) => typeOf({ ...schema, type: one }, depth));
    return kinds.length ? [...new Set(kinds)].sort().join(" | ") : "unknown";
  }
  switch (kind) {
    case "string": return "string";
    case "integer":
    case "number": return "number";
    case "boolean": return "boolean";
    case "null": return "null";
    case "array": return `Array<${typeOf(schema.items, depth + 1)}>`;
    case "object": {
      const properties = schema.properties && typeof schema.properties === "object" ? schema.properties : {};
      const required = new Set(Array.isArray(schema.required) ? schema.required : []);
      const fields = Object.keys(properties).sort().map((key) =>
        `${JSON.stringify(key)}${required.has(key) ? "" : "?"}: ${typeOf(properties[key], depth + 1)}`);
      return fields.length ? `{ ${fields.join("; ")} }` : "Record<string, unknown>";
    }
    default: return "unknown";
  }
}

function comment(description) {
  const line = String(description || "").trim().split(/\r?\n|\u2028|\u2029/)[0] || "";
  return line.replace(/\*\//g, "*\\/");
}

function named(pinned) {
  const taken = new Set(["Result"]);
  return [...pinned]
    .sort((a, b) => (String(a.name) < String(b.name) ? -1 : String(a.name) > String(b.name) ? 1 : 0))
    .map((tool) => {
      const fn = identifier(tool.name, taken);
      const output = tool.output_schema && tool.output_schema.type === "object" ? tool.output_schema : null;
      return { tool, fn, result: output ? identifier(`${fn}_result`, taken) : null, output };
    });
}

/** `.d.ts` declarations: one typed async function per pinned tool, its
 * input type from the input schema and its result type from the output
 * schema where the tool declares one. */
export function generateDeclarations(pinned) {
  const lines = ["// Generated from a turn's pinned tools by toolgate_bridge; do not edit.", ""];
  for (const { tool, fn, result, output } of named(pinned)) {
    if (result) lines.push(`export type ${result} = ${typeOf(output)};`);
    lines.push(`/** ${comment(tool.description) || comment(tool.name)} */`);
    const input = typeOf({ ...(tool.input_schema || {}), type: "object" });
    lines.push(`export declare function ${fn}(input: ${input}): Promise<${result || "unknown"}>;`, "");
  }
  return lines.join("\n");
}

/** The module the declarations describe: each function calls its tool. */
export function generateModule(pinned) {
  const lines = ["// Generated from a turn's pinned tools by toolgate_bridge; do not edit.",
    'import { call } from "./toolgate_bridge.mjs";', ""];
  for (const { tool, fn } of named(pinned)) {
    lines.push(`export function ${fn}(input = {}) { return call(${JSON.stringify(String(tool.name))}, input); }`);
  }
  lines.push("");
  return lines.join("\n");
}

// Run as a program (not imported): the generators' command line.
const invoked = Boolean(process.argv[1]) && import.meta.url === pathToFileURL(process.argv[1]).href;
if (invoked) {
  const what = process.argv[2];
  const done = (text) => {
    process.stdout.write(text);
    close();
  };
  if (what === "declarations") tools().then((pinned) => done(generateDeclarations(pinned)));
  else if (what === "module") tools().then((pinned) => done(generateModule(pinned)));
  else if (what === "tools") tools().then((pinned) => done(JSON.stringify(pinned, null, 2) + "\n"));
  else {
    process.stderr.write("usage: node toolgate_bridge.mjs declarations|module|tools\n");
    process.exitCode = 2;
  }
}
