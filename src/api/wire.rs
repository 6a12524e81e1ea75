//! The JSON shapes of the control API, parsed strictly, and its views of
//! recorded rows.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::domain::{
    AgentSpec, IdempotencyClass, Principal, ReviewResolution, RiskLevel, SideEffectClass,
    TrustLevel,
};
use crate::pipeline::RenderedPart;
use crate::ports::{InvocationRecord, McpServerRow};

/// `POST /v1/sessions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenSession {
    pub session_id: Uuid,
    pub tenant_id: String,
    pub principal: Principal,
    pub agent: AgentSpec,
}

/// One call of a batch.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallItem {
    pub call_id: String,
    pub name: String,
    pub arguments: Value,
    /// Labels of where arguments came from, by JSON pointer into
    /// `arguments` (Decision 9); an argument nobody labelled is the
    /// model's, `external_untrusted`.
    #[serde(default)]
    pub argument_trust: std::collections::BTreeMap<String, TrustLevel>,
}

/// `POST /v1/calls`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallsRequest {
    pub session_id: Uuid,
    pub run_id: Uuid,
    pub step_number: i64,
    #[serde(default)]
    pub deadline_at: Option<chrono::DateTime<chrono::Utc>>,
    pub origin_trust: TrustLevel,
    /// The run's remaining tool-call budget, when the runtime keeps one.
    #[serde(default)]
    pub remaining_tool_calls: Option<u64>,
    pub calls: Vec<CallItem>,
}

/// `POST /v1/turns`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenTurn {
    pub session_id: Uuid,
    pub run_id: Uuid,
    pub step_number: i64,
    pub script_sha256: String,
    #[serde(default)]
    pub sandbox_uid: Option<u32>,
    /// The trust of what produced the script; the lowest when unsaid.
    #[serde(default = "untrusted")]
    pub origin_trust: TrustLevel,
    /// The run's deadline, carried by every call of the turn.
    #[serde(default)]
    pub deadline_at: Option<chrono::DateTime<chrono::Utc>>,
}

fn untrusted() -> TrustLevel {
    TrustLevel::ExternalUntrusted
}

/// `POST /v1/approvals/{id}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalDecision {
    pub decision: String,
    pub approver: String,
}

/// The authentication of a tenant server, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerAuth {
    /// One of the six schemes (text, so an unknown one is a rule violation).
    pub scheme: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub credential_ref: Option<String>,
    #[serde(default)]
    pub token_endpoint: Option<String>,
    #[serde(default)]
    pub token_scopes: Option<Vec<String>>,
}

/// `PUT /v1/tenants/{tenant}/mcp-servers/{server_id}`: a tenant's HTTP
/// server. Classification defaults to the most restrictive.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutMcpServer {
    pub endpoint: String,
    #[serde(default)]
    pub auth: Option<ServerAuth>,
    #[serde(default = "external_write")]
    pub side_effect: SideEffectClass,
    #[serde(default = "high")]
    pub risk: RiskLevel,
    #[serde(default = "non_idempotent")]
    pub idempotency: IdempotencyClass,
    #[serde(default)]
    pub required_scopes: Vec<String>,
    #[serde(default = "thirty")]
    pub timeout_seconds: u32,
    #[serde(default = "sixty_four_kib")]
    pub maximum_output_bytes: u64,
    #[serde(default = "enabled")]
    pub enabled: bool,
}

fn external_write() -> SideEffectClass {
    SideEffectClass::ExternalWrite
}
fn high() -> RiskLevel {
    RiskLevel::High
}
fn non_idempotent() -> IdempotencyClass {
    IdempotencyClass::NonIdempotent
}
fn thirty() -> u32 {
    30
}
fn sixty_four_kib() -> u64 {
    64 * 1024
}
fn enabled() -> bool {
    true
}

/// A server row, as the API shows it (a credential reference, never a
/// secret).
pub fn server_view(row: &McpServerRow) -> Value {
    json!({
        "server_id": row.server_id,
        "transport": row.transport,
        "endpoint": row.endpoint,
        "auth": {"scheme": row.auth_scheme, "name": row.auth_name,
                 "credential_ref": row.credential_ref, "token_endpoint": row.token_endpoint,
                 "token_scopes": row.token_scopes},
        "side_effect": row.side_effect,
        "risk": row.risk,
        "idempotency": row.idempotency,
        "required_scopes": row.required_scopes,
        "timeout_seconds": row.timeout_seconds,
        "maximum_output_bytes": row.maximum_output_bytes,
        "enabled": row.enabled,
    })
}

/// `POST /v1/invocations/{id}/complete`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompleteSuspended {
    /// `answered` or `run_cancelled`.
    pub outcome: String,
    /// The user's reply or the child run's result, when answered.
    #[serde(default)]
    pub text: Option<String>,
}

/// `POST /v1/review/{invocation_id}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReviewDecision {
    pub resolution: ReviewResolution,
    pub resolver: String,
    #[serde(default)]
    pub note: Option<String>,
}

/// A query string as a map, percent-decoded (`+` as a space). Refused when
/// an escape is malformed, decodes to text that is not UTF-8, or a key is
/// given twice (a second value would be a guess at which one was meant).
pub fn query(query: Option<&str>) -> Result<HashMap<String, String>, &'static str> {
    let mut map = HashMap::new();
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let form = |text: &str| decode(&text.replace('+', " "));
        let (Some(name), Some(value)) = (form(name), form(value)) else {
            return Err("the query is not valid percent-encoding");
        };
        if map.insert(name, value).is_some() {
            return Err("a query key is given more than once");
        }
    }
    Ok(map)
}

/// Percent-decodes one path segment or query component.
pub fn decode(component: &str) -> Option<String> {
    let bytes = component.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while let Some(&byte) = bytes.get(index) {
        if byte == b'%' {
            let hex = bytes.get(index + 1..index + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            decoded.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            index += 3;
        } else {
            decoded.push(byte);
            index += 1;
        }
    }
    String::from_utf8(decoded).ok()
}

/// What the model reads beside the outcome, as JSON.
pub fn rendered_content(content: &[RenderedPart]) -> Value {
    serde_json::to_value(content).unwrap_or_else(|_| json!([]))
}

/// A recorded row, as operators read it.
pub fn invocation_view(row: &InvocationRecord) -> Value {
    let ended = row.ended();
    let suspension = row.suspension();
    json!({
        "invocation_id": row.identity.id,
        "tenant_id": row.identity.tenant_id,
        "session_id": row.identity.session_id,
        "run_id": row.identity.run_id,
        "step_number": row.identity.step_number,
        "call_id": row.identity.call_id,
        "tool_name": row.identity.tool_name,
        "tool_version": row.identity.tool_version,
        "tool_source": row.identity.tool_source,
        "server_id": row.identity.server_id,
        "arguments": row.identity.arguments,
        "side_effect": row.identity.side_effect,
        "principal": row.identity.principal,
        "status": row.status(),
        "outcome_status": row.outcome_status(),
        "reason_code": row.reason_code,
        "idempotency_class": row.identity.idempotency_class,
        "origin_trust": row.identity.origin_trust,
        "argument_trust": row.identity.argument_trust.labels(),
        "idempotency_key": row.identity.idempotency_key,
        "effect_sent_at": row.effect_sent_at,
        "attempt_number": row.attempt_number,
        "output_bytes": ended.and_then(|ended| ended.output_bytes),
        "truncated": ended.is_some_and(|ended| ended.truncated),
        "artifact_id": ended.and_then(|ended| ended.artifact_id),
        "suspended_kind": suspension.map(|suspension| &suspension.kind),
        "suspended_ref": suspension.map(|suspension| &suspension.reference),
        "parallel_group": row.identity.parallel_group,
        "created_at": row.created_at,
        "started_at": row.started_at,
        "completed_at": ended.map(|ended| ended.completed_at),
        "result": ended.and_then(|ended| ended.result.as_ref()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_are_percent_decoded() {
        assert_eq!(decode("acme%20corp%2Fa").as_deref(), Some("acme corp/a"));
        assert_eq!(decode("%C3%A9").as_deref(), Some("é"));
        assert_eq!(decode("plain").as_deref(), Some("plain"));
        for malformed in ["%", "%2", "%zz", "%FF", "a%2", "%+F", "%-1"] {
            assert_eq!(decode(malformed), None, "{malformed}");
        }
        let parsed = query(Some("tenant_id=a+b%26c&after=3")).unwrap();
        assert_eq!(parsed["tenant_id"], "a b&c");
        assert_eq!(parsed["after"], "3");
        assert!(query(Some("tenant_id=a&tenant_id=b")).is_err());
        assert!(query(Some("a=%zz")).is_err());
        assert_eq!(query(None).unwrap().len(), 0);
    }
}
