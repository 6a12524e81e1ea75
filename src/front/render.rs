//! What MCP clients read: a pinned tool as an MCP `Tool` (the wire name,
//! the description marked when it is a server's, annotations from the
//! operator's classification), a call's end as a `CallToolResult`, and a
//! call's identity from its `_meta` or, failing that, its session and
//! JSON-RPC id. Pure functions over JSON, so the shapes are tested here.

use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::reissue::Reissue;
use super::resources;
use crate::domain::{
    IdempotencyClass, ReasonCode, RiskLevel, SideEffectClass, ToolOutcome, ToolSource, ToolSpec,
    TrustLevel, sha256_hex, valid_identifier,
};
use crate::pipeline::{ConsentAsked, DataArtifact, DataPart, Finished, PinnedTool, RenderedPart};
use crate::ports::front::FrontError;

/// `_meta` keys a client names its call with.
pub const META_RUN_ID: &str = "toolgate/run_id";
/// The step, with [`META_RUN_ID`].
pub const META_STEP: &str = "toolgate/step";
/// The call's id within the step, with [`META_RUN_ID`].
pub const META_CALL_ID: &str = "toolgate/call_id";
/// A trust below the credential's for what proposed the call.
pub const META_ORIGIN_TRUST: &str = "toolgate/origin_trust";
/// The session a result's call was asked in.
pub const META_SESSION_ID: &str = "toolgate/session_id";
/// The row a result or a pending answer is about.
pub const META_INVOCATION_ID: &str = "toolgate/invocation_id";
/// The pinned set's hash a list was answered from; a call naming it is
/// refused when the set has changed since.
pub const META_TOOL_SCHEMA: &str = "toolgate/tool_schema_sha256";
/// How long a stateless client may keep a list: the credential's pinned
/// set changes only when its tools do.
const LIST_TTL_MS: u64 = 60_000;

/// How the re-issue rule placed a call asked again after its answer went
/// undelivered: `same_call` or `past_window`.
pub const META_REISSUE: &str = "toolgate/reissue";

/// The MCP annotations toolgate states for a tool: the operator's
/// classification, never the remote server's claims.
pub fn annotations(spec: &ToolSpec) -> Value {
    let read_only = matches!(
        spec.side_effect,
        SideEffectClass::None
            | SideEffectClass::WorkspaceRead
            | SideEffectClass::NetworkRead
            | SideEffectClass::ExternalRead
    );
    json!({
        "readOnlyHint": read_only,
        "destructiveHint": !read_only && spec.risk != RiskLevel::Low,
        "idempotentHint": matches!(
            spec.idempotency,
            IdempotencyClass::ReadOnly | IdempotencyClass::Idempotent
        ),
        "openWorldHint": matches!(
            spec.side_effect,
            SideEffectClass::NetworkRead | SideEffectClass::ExternalRead | SideEffectClass::ExternalWrite
        ),
    })
}

/// One pinned tool as `tools/list` shows it.
pub fn tool(pinned: &PinnedTool) -> Value {
    let spec = &pinned.tool.spec;
    let description = match (spec.source, spec.server_id.as_deref()) {
        // A server's words are its own: the client is told whose they are.
        (ToolSource::Mcp, Some(server)) => format!(
            "[Tool of MCP server \"{server}\"; the description below is the server's, not toolgate's.]\n{}",
            spec.description
        ),
        _ => spec.description.clone(),
    };
    let mut tool = json!({
        "name": pinned.wire_name,
        "title": spec.name,
        "description": description,
        "inputSchema": object_schema(&spec.input_schema),
        "annotations": annotations(spec),
        "_meta": {"toolgate/name": spec.name, "toolgate/version": spec.version},
    });
    if let Some(output) = &spec.output_schema
        && output.is_object()
    {
        tool["outputSchema"] = output.clone();
    }
    tool
}

/// MCP requires an object schema at the top; a tool declaring anything else
/// is shown as taking an object, and its own schema still validates.
fn object_schema(schema: &Value) -> Value {
    match schema {
        Value::Object(fields) if fields.get("type").is_none_or(|t| t == "object") => {
            let mut fields = fields.clone();
            fields.insert("type".into(), json!("object"));
            Value::Object(fields)
        }
        _ => json!({"type": "object"}),
    }
}

fn text_block(text: String, trust: Option<TrustLevel>) -> Value {
    match trust {
        Some(trust) => json!({"type": "text", "text": text, "_meta": {"toolgate/trust": trust}}),
        None => json!({"type": "text", "text": text}),
    }
}

/// What the model reads, with a link in place of each artifact it names
/// (the whole of an excerpted result, whose marker the text carries; an
/// image, audio or blob).
fn rendered(content: &[RenderedPart], run_id: Uuid, produced: &[DataArtifact]) -> Vec<Value> {
    let mut blocks = Vec::with_capacity(content.len());
    for part in content {
        match part {
            RenderedPart::Text { text, trust } => {
                blocks.push(text_block(text.clone(), Some(*trust)));
            }
            RenderedPart::Artifact { artifact_id, bytes } => {
                let known = produced.iter().find(|a| a.artifact_id == *artifact_id);
                blocks.push(resources::link(
                    run_id,
                    artifact_id,
                    known.map_or("text/plain", |a| a.media_type.as_str()),
                    *bytes,
                    known.map_or(TrustLevel::ExternalUntrusted, |a| a.trust),
                ));
            }
        }
    }
    blocks
}

/// A finished call of `run_id` as a `CallToolResult`: on success the
/// model-ready content, a link to each artifact the call produced (its
/// images, audio and blobs), and the structured result; otherwise
/// `isError` with the outcome's fixed message as text and the six-field
/// outcome as structured content.
pub fn finished(finished: &Finished, run_id: Uuid) -> Value {
    let mut meta = Map::new();
    if let Some(id) = finished.invocation_id {
        meta.insert(META_INVOCATION_ID.into(), json!(id));
    }
    meta.insert("toolgate/status".into(), json!(finished.outcome.status()));
    let produced = finished
        .data
        .as_ref()
        .map_or(&[][..], |data| data.artifacts.as_slice());
    match &finished.outcome {
        ToolOutcome::Succeeded { .. } => {
            let mut content = rendered(&finished.content, run_id, produced);
            let parts = finished
                .data
                .as_ref()
                .map_or(&[][..], |data| data.content.as_slice());
            for part in parts {
                let DataPart::Artifact {
                    artifact_id,
                    media_type,
                    bytes,
                    trust,
                } = part
                else {
                    continue;
                };
                let uri = resources::artifact_uri(run_id, artifact_id);
                let linked = content
                    .iter()
                    .any(|block| block.get("uri").and_then(Value::as_str) == Some(uri.as_str()));
                if !linked {
                    content.push(resources::link(
                        run_id,
                        artifact_id,
                        media_type,
                        *bytes,
                        *trust,
                    ));
                }
            }
            if content.is_empty() {
                content.push(text_block(String::new(), None));
            }
            let mut result = json!({"content": content, "isError": false, "_meta": meta});
            if let Some(structured) = finished
                .data
                .as_ref()
                .and_then(|data| data.structured.as_ref())
            {
                result["structuredContent"] = structured.clone();
            }
            result
        }
        ToolOutcome::NotSucceeded { reason_code, .. } => {
            let mut content = vec![text_block(message(*reason_code), None)];
            // What the model would have read beside the outcome (a denial's
            // or a failure's detail), rendered as on success.
            content.extend(rendered(&finished.content, run_id, produced));
            json!({
                "content": content,
                "structuredContent": serde_json::to_value(&finished.outcome).unwrap_or(Value::Null),
                "isError": true,
                "_meta": meta,
            })
        }
    }
}

/// JSON-RPC's code for a rate-limited request, as other MCP gateways
/// answer one (ToolHive's `-32029`).
pub const RATE_LIMITED: i32 = -32029;

/// A rate-limited call, as a JSON-RPC error: when to ask again
/// (`retryAfterSeconds`) and the six-field outcome. Nothing was recorded.
pub fn rate_limited(finished: &Finished) -> FrontError {
    let seconds = finished.retry_after_seconds.unwrap_or(1);
    FrontError {
        code: RATE_LIMITED,
        message: format!("rate limited: try again in {seconds} s"),
        data: Some(json!({
            "retryAfterSeconds": seconds,
            "outcome": finished.outcome,
        })),
    }
}

fn message(code: ReasonCode) -> String {
    format!("{} ({})", code.message(), code.as_str())
}

/// A call still waiting for its approval past the hold.
pub fn pending(invocation_id: Uuid, approval_id: Uuid) -> Value {
    json!({
        "content": [text_block(format!(
            "This call waits for a human's approval ({approval_id}). Nothing has run. Ask for the same call again once it is decided: it resumes this one, it does not start another."
        ), None)],
        "structuredContent": {
            "status": "pending",
            "approval_id": approval_id,
            "invocation_id": invocation_id,
            "message": "waiting for approval; ask for the same call again once it is decided",
        },
        "isError": true,
        "_meta": {META_INVOCATION_ID: invocation_id, "toolgate/status": "pending"},
    })
}

/// A control tool that suspended the run: it completes through the control
/// API, not through this client.
pub fn suspended(invocation_id: Uuid, kind: &str, reference: &str) -> Value {
    json!({
        "content": [text_block(format!(
            "This call suspended the run ({kind}); it completes through toolgate's control API."
        ), None)],
        "structuredContent": {"status": "suspended", "kind": kind, "reference": reference,
                              "invocation_id": invocation_id},
        "isError": true,
        "_meta": {META_INVOCATION_ID: invocation_id, "toolgate/status": "suspended"},
    })
}

/// The state a consent elicitation's retry carries: it names nothing, since
/// the call it asks again recorded nothing.
pub const CONSENT_STATE: &str = "consent";

/// Where a call that needs the person's consent sends them, in `_meta`
/// beside the six-field outcome (whose content says it as platform text).
pub fn ask_consent(result: &mut Value, consent: &ConsentAsked) {
    result["_meta"]["toolgate/consent"] =
        json!({"serverId": consent.server_id, "url": consent.url});
}

/// The consent page a result asks its person to open, if it asks.
pub fn consent_of(result: &Value) -> Option<&str> {
    result
        .pointer("/_meta/toolgate~1consent/url")
        .and_then(Value::as_str)
}

/// A call that needs the person's consent, as an `InputRequiredResult` for
/// a client that opens URLs: toolgate's consent page for the server. Its
/// retry is the same call, asked again.
pub fn consent_elicitation(result: &Value) -> Value {
    let url = consent_of(result).unwrap_or_default();
    let server = result
        .pointer("/_meta/toolgate~1consent/serverId")
        .and_then(Value::as_str)
        .unwrap_or_default();
    json!({
        "resultType": "input_required",
        "inputRequests": {"consent": {"method": "elicitation/create", "params": {
            "mode": "url",
            "message": format!("This tool acts with your own account at {server}, which you have not granted. Nothing has run. Open the page to consent; then continue."),
            "url": url,
        }}},
        "requestState": CONSENT_STATE,
    })
}

/// A held call as an `InputRequiredResult` for a client that opens URLs:
/// the console's page for its approval (`pages` ends `/approvals/`), and
/// the row's id as the state its retry carries back.
pub fn approval_elicitation(pending: &Value, tenant_id: &str, pages: &str) -> Value {
    let approval = pending
        .pointer("/structuredContent/approval_id")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let invocation = invocation_of(pending)
        .map(|id| id.to_string())
        .unwrap_or_default();
    json!({
        "resultType": "input_required",
        "inputRequests": {"approval": {"method": "elicitation/create", "params": {
            "mode": "url",
            "message": format!("This call waits for a human's approval ({approval}). Nothing has run. Open the page to see it and, if you may, decide; then continue."),
            "url": format!("{pages}{tenant_id}/{approval}"),
            "elicitationId": "",
        }}},
        "requestState": invocation,
    })
}

/// Whether a result says its call is running elsewhere and was not
/// recorded as this request's (another node or request holds it).
pub fn is_in_progress(result: &Value) -> bool {
    invocation_of(result).is_none()
        && result.pointer("/structuredContent/reason_code")
            == Some(&json!(ReasonCode::ToolConcurrencyConflict.as_str()))
}

/// Whether a result says its call waits for an approval.
pub fn is_pending(result: &Value) -> bool {
    result.pointer("/structuredContent/status") == Some(&json!("pending"))
}

/// How long identical calls of a caller that names no steps count toward
/// the loop breaker together: the run of such a call is its session's for
/// the current period of this length (UTC, aligned, the same on every
/// node), so a loop is identical calls in quick succession, not over a
/// conversation.
pub const LOOP_PERIOD_SECONDS: i64 = 600;

/// The run an unnamed call of `session_id` at `at` is in.
pub fn unnamed_run(session_id: Uuid, at: chrono::DateTime<chrono::Utc>) -> Uuid {
    let period = at.timestamp().div_euclid(LOOP_PERIOD_SECONDS);
    derived_uuid(&format!("toolgate/unnamed-run\0{session_id}\0{period}"))
}

/// A UUID (version 8) that `text` alone determines.
pub fn derived_uuid(text: &str) -> Uuid {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(text.as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(bytes).into_uuid()
}

/// The row a result is about, when it has one.
pub fn invocation_of(result: &Value) -> Option<Uuid> {
    result
        .pointer("/_meta")
        .and_then(|meta| meta.get(META_INVOCATION_ID))
        .and_then(Value::as_str)
        .and_then(|id| id.parse().ok())
}

/// Names the session and run a call was recorded in, in its result's
/// `_meta`.
pub fn mark_run(result: &mut Value, session_id: Uuid, run_id: Uuid) {
    if let Some(meta) = result.get_mut("_meta").and_then(Value::as_object_mut) {
        meta.insert(META_SESSION_ID.into(), json!(session_id));
        meta.insert(META_RUN_ID.into(), json!(run_id));
    }
}

/// Marks a result as the recorded answer of an undelivered twin; past the
/// window the client is told why nothing ran again and how to ask for a
/// new call.
pub fn mark_reissue(result: &mut Value, reissue: Reissue, window: std::time::Duration) {
    if let Some(meta) = result.get_mut("_meta").and_then(Value::as_object_mut) {
        meta.insert(META_REISSUE.into(), json!(reissue.as_str()));
    }
    if reissue != Reissue::PastWindow {
        return;
    }
    let note = text_block(
        format!(
            "An identical call of yours was asked before and its answer never reached you; the {} s in which asking again is the same call have passed, so toolgate cannot tell whether you mean that call or a new one. This is that call's recorded outcome: nothing ran again. To run it anew, name the call in _meta ({META_RUN_ID}, {META_STEP}, {META_CALL_ID}).",
            window.as_secs()
        ),
        Some(TrustLevel::Platform),
    );
    if let Some(content) = result.get_mut("content").and_then(Value::as_array_mut) {
        content.insert(0, note);
    }
}

/// A result as a client of `stateless` revision reads it: `resultType`
/// (the protocol's side takes it off again for a client with sessions) and, without
/// sessions, the server's identity in `_meta`.
pub fn completed(result: &mut Value, stateless: bool) {
    let Some(fields) = result.as_object_mut() else {
        return;
    };
    fields.insert("resultType".into(), json!("complete"));
    if stateless {
        let meta = fields.entry("_meta").or_insert_with(|| json!({}));
        if let Some(meta) = meta.as_object_mut() {
            meta.insert(
                "io.modelcontextprotocol/serverInfo".into(),
                json!({"name": "toolgate", "version": env!("CARGO_PKG_VERSION")}),
            );
        }
    }
}

/// A list result: as [`completed`], and without sessions how long it may
/// be kept and by whom (`private`: lists differ by credential).
pub fn listed(result: &mut Value, stateless: bool) {
    completed(result, stateless);
    if stateless && let Some(fields) = result.as_object_mut() {
        fields.insert("ttlMs".into(), json!(LIST_TTL_MS));
        fields.insert("cacheScope".into(), json!("private"));
    }
}

/// Who a call is, as the pipeline identifies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallIdentity {
    /// The run.
    pub run_id: Uuid,
    /// The step.
    pub step_number: i64,
    /// The call within the step.
    pub call_id: String,
    /// Whether the client named it (`_meta`) or the session and JSON-RPC id
    /// stand for it.
    pub named: bool,
    /// A lower trust the client stated for what proposed the call.
    pub origin_trust: Option<TrustLevel>,
}

/// A call's identity: `_meta`'s `toolgate/run_id`, `toolgate/step` and
/// `toolgate/call_id` together, or else the session as the run, step 0,
/// and the JSON-RPC request id, so a retry of the same request in the same
/// session is the same call.
pub fn identity(
    meta: &Value,
    request_id: &Value,
    session_id: Uuid,
) -> Result<CallIdentity, String> {
    let origin_trust = match meta.get(META_ORIGIN_TRUST) {
        None | Some(Value::Null) => None,
        Some(value) => Some(
            serde_json::from_value::<TrustLevel>(value.clone())
                .map_err(|_| format!("_meta {META_ORIGIN_TRUST} must be a trust level"))?,
        ),
    };
    let named =
        [META_RUN_ID, META_STEP, META_CALL_ID].map(|key| meta.get(key).filter(|v| !v.is_null()));
    match named {
        [None, None, None] => Ok(CallIdentity {
            run_id: session_id,
            step_number: 0,
            call_id: request_call_id(request_id),
            named: false,
            origin_trust,
        }),
        [Some(run), Some(step), Some(call)] => {
            let run_id = run
                .as_str()
                .and_then(|text| text.parse::<Uuid>().ok())
                .ok_or_else(|| format!("_meta {META_RUN_ID} must be a UUID"))?;
            let step_number = step
                .as_i64()
                .filter(|step| *step >= 0)
                .ok_or_else(|| format!("_meta {META_STEP} must be a non-negative integer"))?;
            let call_id = call
                .as_str()
                .filter(|id| valid_identifier(id))
                .ok_or_else(|| {
                    format!(
                        "_meta {META_CALL_ID} must be 1 to 256 bytes without control characters"
                    )
                })?
                .to_owned();
            Ok(CallIdentity {
                run_id,
                step_number,
                call_id,
                named: true,
                origin_trust,
            })
        }
        _ => Err(format!(
            "_meta {META_RUN_ID}, {META_STEP} and {META_CALL_ID} go together: all three or none"
        )),
    }
}

/// The call id a JSON-RPC request id stands for: `mcp:` and the number, or
/// `mcp:s:` and the string when short and plain, else its digest, so `1`
/// and `"1"` are different calls.
fn request_call_id(request_id: &Value) -> String {
    match request_id {
        Value::Number(number) => format!("mcp:{number}"),
        Value::String(text)
            if text.len() <= 128
                && text.bytes().all(|b| {
                    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':')
                }) =>
        {
            format!("mcp:s:{text}")
        }
        other => format!("mcp:h:{}", &sha256_hex(other.to_string().as_bytes())[..32]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_named_by_all_three_or_by_its_request() {
        let session = Uuid::new_v4();
        let run = Uuid::new_v4();
        let unnamed = identity(&json!({"progressToken": 3}), &json!(7), session).unwrap();
        assert_eq!(
            (
                unnamed.run_id,
                unnamed.step_number,
                unnamed.call_id.as_str(),
                unnamed.named
            ),
            (session, 0, "mcp:7", false)
        );
        assert_ne!(
            identity(&json!({}), &json!("7"), session).unwrap().call_id,
            identity(&json!({}), &json!(7), session).unwrap().call_id
        );
        let long = "x".repeat(500);
        let hashed = identity(&json!({}), &json!(long), session).unwrap().call_id;
        assert!(hashed.starts_with("mcp:h:") && hashed.len() < 64);
        let named = identity(
            &json!({META_RUN_ID: run.to_string(), META_STEP: 4, META_CALL_ID: "call_1",
                    META_ORIGIN_TRUST: "external_untrusted"}),
            &json!(7),
            session,
        )
        .unwrap();
        assert_eq!(
            named,
            CallIdentity {
                run_id: run,
                step_number: 4,
                call_id: "call_1".into(),
                named: true,
                origin_trust: Some(TrustLevel::ExternalUntrusted),
            }
        );
        for bad in [
            json!({META_RUN_ID: run.to_string()}),
            json!({META_RUN_ID: "x", META_STEP: 1, META_CALL_ID: "c"}),
            json!({META_RUN_ID: run.to_string(), META_STEP: -1, META_CALL_ID: "c"}),
            json!({META_RUN_ID: run.to_string(), META_STEP: 1, META_CALL_ID: ""}),
            json!({META_ORIGIN_TRUST: "root"}),
        ] {
            assert!(identity(&bad, &json!(1), session).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_unnamed_calls_run_is_its_sessions_for_the_period() {
        let session = Uuid::new_v4();
        let at = |seconds: i64| chrono::DateTime::from_timestamp(seconds, 0).unwrap();
        let start = 1_800_000_000 - 1_800_000_000 % LOOP_PERIOD_SECONDS;
        let run = unnamed_run(session, at(start));
        assert_eq!(
            run,
            unnamed_run(session, at(start + LOOP_PERIOD_SECONDS - 1))
        );
        assert_ne!(run, unnamed_run(session, at(start + LOOP_PERIOD_SECONDS)));
        assert_ne!(run, unnamed_run(Uuid::new_v4(), at(start)));
        assert_ne!(run, session);
    }

    #[test]
    fn schemas_shown_are_objects() {
        assert_eq!(object_schema(&json!(true)), json!({"type": "object"}));
        assert_eq!(
            object_schema(&json!({"properties": {"a": {}}})),
            json!({"type": "object", "properties": {"a": {}}})
        );
        assert_eq!(
            object_schema(&json!({"type": "string"})),
            json!({"type": "object"})
        );
    }

    #[test]
    fn a_results_artifacts_are_linked_once_each_in_order() {
        let run = Uuid::new_v4();
        let artifact = |id: &str, media_type: &str, bytes: u64| DataArtifact {
            artifact_id: id.into(),
            media_type: media_type.into(),
            bytes,
            trust: TrustLevel::ExternalUntrusted,
        };
        let capture = artifact("5b0d7a44-0000-4000-8000-000000000001", "text/plain", 90_000);
        let image = artifact("5b0d7a44-0000-4000-8000-000000000002", "image/png", 68);
        let blob = artifact("5b0d7a44-0000-4000-8000-000000000003", "text/html", 10);
        let end = Finished {
            invocation_id: Some(Uuid::new_v4()),
            outcome: ToolOutcome::Succeeded {
                action: "mcp.files.read".into(),
            },
            content: vec![
                RenderedPart::Text {
                    text: "head … tail".into(),
                    trust: TrustLevel::ExternalUntrusted,
                },
                RenderedPart::Artifact {
                    artifact_id: capture.artifact_id.clone(),
                    bytes: capture.bytes,
                },
            ],
            data: Some(crate::pipeline::ResultData {
                content: vec![
                    DataPart::artifact(&capture),
                    DataPart::artifact(&image),
                    DataPart::artifact(&blob),
                ],
                structured: None,
                artifacts: vec![image.clone(), blob.clone(), capture.clone()],
            }),
            synthesis_only: false,
            retry_after_seconds: None,
            consent: None,
        };
        let result = finished(&end, run);
        let content = result["content"].as_array().unwrap();
        let links: Vec<&Value> = content
            .iter()
            .filter(|block| block["type"] == "resource_link")
            .collect();
        assert_eq!(links.len(), 3, "{content:?}");
        assert_eq!(
            links[0]["uri"],
            format!("toolgate://runs/{run}/artifacts/{}", capture.artifact_id)
        );
        assert_eq!(
            content[1], *links[0],
            "the link stands where the artifact was"
        );
        assert_eq!(links[0]["mimeType"], "text/plain");
        assert_eq!(links[0]["size"], 90_000);
        assert_eq!(links[1]["mimeType"], "image/png");
        // A type a browser could run is named as opaque bytes.
        assert_eq!(links[2]["mimeType"], "application/octet-stream");
    }

    #[test]
    fn an_uncertain_end_says_do_not_repeat_in_both_parts() {
        let end = Finished {
            invocation_id: Some(Uuid::new_v4()),
            outcome: ToolOutcome::not_succeeded("mcp.mail.send", ReasonCode::ToolOutcomeUnknown),
            content: Vec::new(),
            data: None,
            synthesis_only: false,
            retry_after_seconds: None,
            consent: None,
        };
        let result = finished(&end, Uuid::new_v4());
        assert_eq!(result["isError"], true);
        assert!(
            result["content"][0]["text"]
                .as_str()
                .unwrap()
                .contains("Do not repeat")
        );
        assert!(
            result["structuredContent"]["message"]
                .as_str()
                .unwrap()
                .contains("Do not repeat")
        );
        assert_eq!(result["structuredContent"]["status"], "uncertain");
    }
}
