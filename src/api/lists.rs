//! The operator's lists: invocations, approvals, review items, sessions,
//! turns, servers, catalog generations and tool health. The control API's
//! principal is the operator, so every list spans tenants and `tenant_id`
//! only narrows it; each pages newest first with an opaque cursor.
//!
//! A bad filter is refused with a message that names the field and its
//! rule, never the value given.

use chrono::{DateTime, Utc};
use hyper::StatusCode;
use serde_json::{Value, json};

use super::listen::{Query, Routed};
use super::wire::{invocation_view, server_view};
use super::{ApiError, ControlApi};
use crate::domain::HealthWindow;
use crate::edge::{Reply, reply};
use crate::ports::store::{DEFAULT_PAGE, MAXIMUM_PAGE};
use crate::ports::{
    ApprovalItem, CatalogGenerationItem, Cursor, EventRecord, OperatorFilter, PageRequest,
    ReviewItem, ServerItem, SessionRecord, ToolHealth, TurnRecord,
};

/// A list's `status` values: what each means is the list's own, and `all`
/// (where listed) filters nothing.
struct Statuses {
    /// The values, `all` included where it is one.
    allowed: &'static [&'static str],
    /// What an absent `status` means.
    default: Option<&'static str>,
    /// The message a value outside `allowed` gets.
    rule: &'static str,
}

const INVOCATION_STATUSES: Statuses = Statuses {
    allowed: &[
        "authorized",
        "waiting_for_approval",
        "running",
        "succeeded",
        "failed",
        "denied",
        "uncertain",
    ],
    default: None,
    rule: "status must be an invocation status: authorized, waiting_for_approval, running, \
           succeeded, failed, denied or uncertain",
};

const APPROVAL_STATUSES: Statuses = Statuses {
    allowed: &["pending", "approved", "denied", "expired", "all"],
    default: Some("pending"),
    rule: "status must be pending, approved, denied, expired or all",
};

const REVIEW_STATUSES: Statuses = Statuses {
    allowed: &["pending", "resolved", "all"],
    default: Some("pending"),
    rule: "status must be pending, resolved or all",
};

const TURN_STATUSES: Statuses = Statuses {
    allowed: &["open", "closed", "expired", "suspended", "all"],
    default: None,
    rule: "status must be open, closed, expired, suspended or all",
};

/// An RFC 3339 time in `field`, if given.
fn time(query: &Query, field: &str) -> Result<Option<DateTime<Utc>>, ApiError> {
    query
        .get(field)
        .map(|text| {
            DateTime::parse_from_rfc3339(text)
                .map(|at| at.with_timezone(&Utc))
                .map_err(|_| ApiError::Invalid(format!("{field} must be an RFC 3339 time")))
        })
        .transpose()
}

/// A name filter (`tool_name`, `server_id`), if given: at most 256 bytes
/// without control characters, as every name the lists hold.
fn name(query: &Query, field: &str) -> Result<Option<String>, ApiError> {
    match query.get(field) {
        Some(value) if crate::domain::valid_identifier(value) => Ok(Some(value.to_owned())),
        Some(_) => Err(ApiError::Invalid(format!(
            "{field} must be 1 to 256 bytes without control characters"
        ))),
        None => Ok(None),
    }
}

/// The filter and page a list's query asks for; `name_field` is the key
/// its name filter is given under, `statuses` its status values.
fn list_query(
    query: &Query,
    name_field: Option<&str>,
    statuses: Option<&Statuses>,
) -> Result<(OperatorFilter, PageRequest), ApiError> {
    let status = match statuses {
        None => None,
        Some(statuses) => match query.get("status").or(statuses.default) {
            Some(status) if statuses.allowed.contains(&status) => {
                (status != "all").then(|| status.to_owned())
            }
            Some(_) => return Err(ApiError::Invalid(statuses.rule.into())),
            None => None,
        },
    };
    let filter = OperatorFilter {
        tenant_id: query.optional_tenant()?,
        tool_name: match name_field {
            Some(field) => name(query, field)?,
            None => None,
        },
        status,
        session_id: match query.get("session_id") {
            None => None,
            Some(text) => Some(
                text.parse::<uuid::Uuid>()
                    .map_err(|_| ApiError::Invalid("session_id must be a UUID".into()))?,
            ),
        },
        since: time(query, "since")?,
        until: time(query, "until")?,
    };
    let limit = match query.get("limit") {
        None => DEFAULT_PAGE,
        Some(text) => text
            .parse::<u32>()
            .ok()
            .filter(|limit| (1..=MAXIMUM_PAGE).contains(limit))
            .ok_or_else(|| ApiError::Invalid(format!("limit must be 1 to {MAXIMUM_PAGE}")))?,
    };
    let after = query
        .get("cursor")
        .map(Cursor::decode)
        .transpose()
        .map_err(|_| ApiError::Invalid("cursor must be a next_cursor a list returned".into()))?;
    Ok((filter, PageRequest { limit, after }))
}

/// A page as the wire has it: the items under `key`, and the cursor.
fn page_reply(key: &str, items: Vec<Value>, next_cursor: Option<Cursor>) -> Reply {
    reply(
        StatusCode::OK,
        &json!({key: items, "next_cursor": next_cursor.map(|cursor| cursor.to_string())}),
    )
}

/// An event as the lists show it, the same fields the event stream has.
pub(super) fn event_view(event: &EventRecord) -> Value {
    json!({
        "id": event.id,
        "event_type": event.event_type,
        "tenant_id": event.tenant_id,
        "payload": event.payload,
        "created_at": event.created_at,
    })
}

fn approval_view(item: &ApprovalItem) -> Value {
    json!({
        "approval_id": item.approval_id,
        "tenant_id": item.tenant_id,
        "invocation_id": item.invocation_id,
        "tool_name": item.tool_name,
        "arguments": item.arguments,
        "side_effect": item.side_effect,
        "idempotency_class": item.idempotency_class,
        "origin_trust": item.origin_trust,
        "reason_code": item.reason_code,
        "principal": item.principal,
        "session_id": item.session_id,
        "run_id": item.run_id,
        "step_number": item.step_number,
        "call_id": item.call_id,
        "turn_id": item.turn_id,
        "status": item.status,
        "requested_at": item.requested_at,
        "hold_ends_at": item.hold_ends_at,
        "approver": item.approver,
        "decided_at": item.decided_at,
    })
}

fn review_view(item: &ReviewItem) -> Value {
    let mut view = invocation_view(&item.invocation);
    view["resolution"] = item.resolution.as_ref().map_or(Value::Null, |review| {
        json!({
            "resolution": review.resolution,
            "resolver": review.resolver,
            "note": review.note,
            "resolved_at": review.resolved_at,
        })
    });
    view
}

fn session_view(session: &SessionRecord) -> Value {
    json!({
        "session_id": session.session_id,
        "tenant_id": session.tenant_id,
        "principal": session.principal,
        "agent": session.agent,
        "tool_schema_sha256": session.tool_schema_sha256,
        "tools": session.tool_names,
        "opened_at": session.opened_at,
        "last_used_at": session.last_used_at,
    })
}

fn turn_view(turn: &TurnRecord) -> Value {
    json!({
        "turn_id": turn.turn_id,
        "tenant_id": turn.tenant_id,
        "session_id": turn.session_id,
        "run_id": turn.run_id,
        "step_number": turn.step_number,
        "script_sha256": turn.script_sha256,
        "state": turn.state,
        "calls": turn.calls,
        "opened_at": turn.opened_at,
        "expires_at": turn.expires_at,
        "closed_at": turn.closed_at,
    })
}

fn server_item_view(item: &ServerItem) -> Value {
    let mut view = server_view(&item.server);
    view["tenant_id"] = json!(item.tenant_id);
    view["tenant_configured"] = json!(item.tenant_configured);
    view["created_at"] = json!(item.created_at);
    view["last_connection"] = item.last_connection.as_ref().map_or(Value::Null, |last| {
        json!({
            // `mcp.server.connected` reads as `connected`.
            "outcome": last.event_type.rsplit('.').next(),
            "reason_code": last.reason_code,
            "at": last.at,
        })
    });
    view
}

fn generation_view(generation: &CatalogGenerationItem) -> Value {
    json!({
        "tenant_id": generation.tenant_id,
        "server_id": generation.server_id,
        "catalog_hash": generation.catalog_hash,
        "discovered_at": generation.discovered_at,
        "tools": generation.tools,
        "withdrawn": generation.withdrawn,
    })
}

fn health_view(health: &ToolHealth) -> Value {
    let failures: serde_json::Map<String, Value> = health
        .failures
        .iter()
        .map(|(code, n)| (code.clone(), json!(n)))
        .collect();
    json!({
        "tool_name": health.tool_name,
        "calls": health.calls,
        "failures": failures,
        "uncertain": health.uncertain,
        "p50_ms": health.p50_ms,
        "p99_ms": health.p99_ms,
    })
}

impl ControlApi {
    /// `GET /v1/invocations`.
    pub(super) async fn list_invocations(&self, routed: Routed) -> Result<Reply, ApiError> {
        let (filter, page) =
            list_query(&routed.query, Some("tool_name"), Some(&INVOCATION_STATUSES))?;
        let listed = self.parts.operator.list_invocations(&filter, page).await?;
        let items = listed.items.iter().map(invocation_view).collect();
        Ok(page_reply("invocations", items, listed.next_cursor))
    }

    /// `GET /v1/approvals`: pending unless `status` says otherwise.
    pub(super) async fn list_approvals(&self, routed: Routed) -> Result<Reply, ApiError> {
        let (filter, page) =
            list_query(&routed.query, Some("tool_name"), Some(&APPROVAL_STATUSES))?;
        let listed = self.parts.operator.list_approvals(&filter, page).await?;
        let items = listed.items.iter().map(approval_view).collect();
        Ok(page_reply("approvals", items, listed.next_cursor))
    }

    /// `GET /v1/review`: the queue unless `status` says otherwise.
    pub(super) async fn list_review(&self, routed: Routed) -> Result<Reply, ApiError> {
        let (filter, page) = list_query(&routed.query, Some("tool_name"), Some(&REVIEW_STATUSES))?;
        let listed = self.parts.operator.list_review_items(&filter, page).await?;
        let items = listed.items.iter().map(review_view).collect();
        Ok(page_reply("uncertain", items, listed.next_cursor))
    }

    /// `GET /v1/sessions`: open sessions.
    pub(super) async fn list_sessions(&self, routed: Routed) -> Result<Reply, ApiError> {
        let (filter, page) = list_query(&routed.query, None, None)?;
        let listed = self.parts.operator.list_sessions(&filter, page).await?;
        let items = listed.items.iter().map(session_view).collect();
        Ok(page_reply("sessions", items, listed.next_cursor))
    }

    /// `GET /v1/turns`: open and closed.
    pub(super) async fn list_turns(&self, routed: Routed) -> Result<Reply, ApiError> {
        let (filter, page) = list_query(&routed.query, None, Some(&TURN_STATUSES))?;
        let listed = self.parts.operator.list_turns(&filter, page).await?;
        let items = listed.items.iter().map(turn_view).collect();
        Ok(page_reply("turns", items, listed.next_cursor))
    }

    /// `GET /v1/mcp-servers`.
    pub(super) async fn list_servers(&self, routed: Routed) -> Result<Reply, ApiError> {
        let (filter, page) = list_query(&routed.query, Some("server_id"), None)?;
        let listed = self.parts.operator.list_servers(&filter, page).await?;
        let items = listed.items.iter().map(server_item_view).collect();
        Ok(page_reply("servers", items, listed.next_cursor))
    }

    /// `GET /v1/catalog-generations`.
    pub(super) async fn list_generations(&self, routed: Routed) -> Result<Reply, ApiError> {
        let (filter, page) = list_query(&routed.query, Some("server_id"), None)?;
        let listed = self
            .parts
            .operator
            .list_catalog_generations(&filter, page)
            .await?;
        let items = listed.items.iter().map(generation_view).collect();
        Ok(page_reply("generations", items, listed.next_cursor))
    }

    /// `GET /v1/tool-health?window=hour|day`.
    pub(super) async fn tool_health(&self, routed: Routed) -> Result<Reply, ApiError> {
        let window = match routed.query.get("window") {
            None => HealthWindow::Hour,
            Some(text) => text
                .parse::<HealthWindow>()
                .map_err(|_| ApiError::Invalid("window must be hour or day".into()))?,
        };
        let filter = OperatorFilter {
            tenant_id: routed.query.optional_tenant()?,
            tool_name: name(&routed.query, "tool_name")?,
            ..OperatorFilter::default()
        };
        let since = self.parts.clock.now() - chrono::TimeDelta::seconds(window.seconds());
        let tools = self.parts.operator.tool_health(&filter, since).await?;
        let tools: Vec<Value> = tools.iter().map(health_view).collect();
        Ok(reply(
            StatusCode::OK,
            &json!({"window": window, "since": since, "tools": tools}),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{ApprovalStatus, InvocationStatus, TurnState};

    /// The statuses a list takes are the domain's spellings, so the store
    /// compares them with what it wrote.
    #[test]
    fn list_statuses_are_the_domain_spellings() {
        for status in INVOCATION_STATUSES.allowed {
            assert!(status.parse::<InvocationStatus>().is_ok(), "{status}");
        }
        for (statuses, parse) in [
            (
                &APPROVAL_STATUSES,
                (|s: &str| s.parse::<ApprovalStatus>().is_ok()) as fn(&str) -> bool,
            ),
            (&TURN_STATUSES, |s: &str| s.parse::<TurnState>().is_ok()),
        ] {
            for status in statuses.allowed.iter().filter(|s| **s != "all") {
                assert!(parse(status), "{status}");
            }
        }
    }
}
