// The TypeScript SDK's 2.x client (@modelcontextprotocol/client) against
// toolgate's front door in the era without sessions (pinned to
// 2026-07-28: server/discover, then every request on its own), as an
// application uses it. Prints one JSON report; the Rust test judges it.
//
//   node front_typescript_v2.cjs PHASE URL   (NODE_PATH names the SDK's folder)
//   TOOLGATE_FRONT_KEY: the bearer credential; TOOLGATE_RUN_ID: the run the
//   named calls are in.

const { Client, StreamableHTTPClientTransport } = require("@modelcontextprotocol/client");

const [phase, url] = process.argv.slice(2);
const key = process.env.TOOLGATE_FRONT_KEY;
const run = process.env.TOOLGATE_RUN_ID;

const named = (step, callId) => ({ "toolgate/run_id": run, "toolgate/step": step, "toolgate/call_id": callId });

const summary = (result) => ({
  is_error: Boolean(result.isError),
  text: (result.content || []).map((block) => block.text || "").join(" "),
  structured: result.structuredContent ?? null,
  invocation_id: (result._meta || {})["toolgate/invocation_id"] ?? null,
  reissue: (result._meta || {})["toolgate/reissue"] ?? null,
});

async function connect() {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${key}` } },
  });
  const client = new Client(
    { name: "toolgate-front-test", version: "2.0.0" },
    { versionNegotiation: { mode: { pin: "2026-07-28" } } },
  );
  await client.connect(transport);
  return { client, transport };
}

async function call(client, name, args, meta, progress) {
  const params = { name, arguments: args };
  if (meta) params._meta = meta;
  const options = { timeout: 60000 };
  if (progress) options.onprogress = (note) => progress.push(note.message);
  return summary(await client.callTool(params, options));
}

async function first(report) {
  const { client, transport } = await connect();
  report.protocol_version = client.getNegotiatedProtocolVersion() ?? null;
  report.session = transport.sessionId ?? null;
  const { tools } = await client.listTools();
  report.tools = tools.map((tool) => tool.name).sort();
  report.annotations = Object.fromEntries(tools.map((tool) => [tool.name, tool.annotations || {}]));
  report.echo = await call(client, "demo-echo", { text: "from typescript" });
  report.denied = await call(client, "demo-keyed_write", { line: "no" });
  report.uncertain = await call(client, "mcp-writes-write_then_die", { line: "maybe" });
  const progress = [];
  report.pending = await call(client, "demo-external_write", { line: "typescript" }, named(1, "approve-me"), progress);
  report.progress = progress;
  report.write = await call(client, "mcp-writes-write", { line: "typescript" }, named(1, "write"));
  await client.close();
}

async function second(report) {
  const { client } = await connect();
  report.write_again = await call(client, "mcp-writes-write", { line: "typescript" }, named(1, "write"));
  report.resumed = await call(client, "demo-external_write", { line: "typescript" }, named(1, "approve-me"));
  report.resumed_again = await call(client, "demo-external_write", { line: "typescript" }, named(1, "approve-me"));
  await client.close();
}

// The stream of this call breaks after its effect (a proxy cuts it); the
// SDK rejects the call, and the application connects again and asks for the
// same call, naming nothing, as the revision requires of a client.
async function reissue(report) {
  const { client } = await connect();
  try {
    await call(client, "mcp-writes-write", { line: "sdk" });
    report.broken = null;
  } catch (error) {
    report.broken = String(error && error.message ? error.message : error).slice(0, 200);
  }
  await client.close().catch(() => {});
  const again = await connect();
  report.again = await call(again.client, "mcp-writes-write", { line: "sdk" });
  // Delivered now: the application's next identical call is a new one.
  report.new = await call(again.client, "mcp-writes-write", { line: "sdk" });
  await again.client.close();
}

(async () => {
  const report = {};
  await { first, second, reissue }[phase](report);
  console.log(JSON.stringify(report));
})().catch((error) => {
  console.error(error);
  process.exit(1);
});
