//! The operator's reads: lists that span tenants (the control API's and the
//! console's principal is the operator), filtered and paged with a cursor,
//! and the turns the bridge records so they can be listed after their
//! socket is gone.
//!
//! Every list is newest first and paged on a key of (time, id): a row
//! inserted while an operator pages lands before the first page, never
//! inside one, so no row is skipped or shown twice.

use std::fmt;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::{EventRecord, InvocationRecord, McpServerRow, ReviewRecord, SessionRecord, StoreError};
use crate::domain::{
    ApprovalStatus, IdempotencyClass, Principal, ReasonCode, SideEffectClass, TrustLevel, TurnState,
};
use crate::ports::tool::BoxFuture;

/// The most rows one page holds.
pub const MAXIMUM_PAGE: u32 = 500;
/// Rows per page when the caller names no limit.
pub const DEFAULT_PAGE: u32 = 50;

/// What an operator list is narrowed to; every field is optional and they
/// combine with AND.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperatorFilter {
    /// Only this tenant's rows.
    pub tenant_id: Option<String>,
    /// Only rows of this registry name (a server id, for servers and
    /// catalog generations).
    pub tool_name: Option<String>,
    /// Only rows in this state, spelled as the list's `status` is.
    pub status: Option<String>,
    /// Only rows of this session (invocations and approvals; the other
    /// lists have no session to filter by).
    pub session_id: Option<Uuid>,
    /// Only rows at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only rows before this time.
    pub until: Option<DateTime<Utc>>,
}

/// Where a page starts: after the row at `at` with key `key`, in the
/// list's newest-first order. Opaque to callers: `<micros>.<32 hex>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    /// The last listed row's time.
    pub at: DateTime<Utc>,
    /// The last listed row's id.
    pub key: Uuid,
}

/// A cursor that is not one this store handed out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cursor is not one a list returned")]
pub struct InvalidCursor;

impl Cursor {
    /// Reads a cursor a page returned.
    pub fn decode(text: &str) -> Result<Cursor, InvalidCursor> {
        let (micros, key) = text.split_once('.').ok_or(InvalidCursor)?;
        // Digits only: `parse` would take a sign, which no cursor has.
        if micros.is_empty() || !micros.bytes().all(|b| b.is_ascii_digit()) || key.len() != 32 {
            return Err(InvalidCursor);
        }
        let micros: i64 = micros.parse().map_err(|_| InvalidCursor)?;
        let at = DateTime::from_timestamp_micros(micros).ok_or(InvalidCursor)?;
        let key = Uuid::try_parse(key).map_err(|_| InvalidCursor)?;
        Ok(Cursor { at, key })
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.at.timestamp_micros(), self.key.simple())
    }
}

/// One page asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRequest {
    /// Rows at most, 1 to [`MAXIMUM_PAGE`].
    pub limit: u32,
    /// Where to start; `None` for the newest rows.
    pub after: Option<Cursor>,
}

impl Default for PageRequest {
    fn default() -> Self {
        PageRequest {
            limit: DEFAULT_PAGE,
            after: None,
        }
    }
}

impl PageRequest {
    /// One more than the limit: what adapters fetch, to know whether a
    /// next page exists without a count.
    pub fn fetch(&self) -> i64 {
        i64::from(self.limit.clamp(1, MAXIMUM_PAGE)) + 1
    }

    /// The page of `rows` (fetched with [`fetch`](Self::fetch), in list
    /// order), with the cursor of its last row when more follow.
    pub fn page<T>(&self, mut rows: Vec<T>, key: impl Fn(&T) -> Cursor) -> Page<T> {
        let limit = self.limit.clamp(1, MAXIMUM_PAGE) as usize;
        let more = rows.len() > limit;
        rows.truncate(limit);
        let next_cursor = if more { rows.last().map(key) } else { None };
        Page {
            items: rows,
            next_cursor,
        }
    }
}

/// One page of a list.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    /// The rows, newest first.
    pub items: Vec<T>,
    /// Where the next page starts; `None` on the last.
    pub next_cursor: Option<Cursor>,
}

/// One invocation row and the events that name it: its story.
#[derive(Debug, Clone, PartialEq)]
pub struct InvocationStory {
    /// The row.
    pub invocation: InvocationRecord,
    /// Its events (the seven tool events, the decisions on it), in id order.
    pub events: Vec<EventRecord>,
}

/// An approval with the call it would allow: what an approver must see to
/// decide, and what stays listable after the decision.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalItem {
    /// The approval.
    pub approval_id: Uuid,
    /// The tenant.
    pub tenant_id: String,
    /// The held invocation.
    pub invocation_id: Uuid,
    /// The registry name.
    pub tool_name: String,
    /// The canonical arguments the approval would allow.
    pub arguments: Value,
    /// The call's side effect, snapshot at authorization.
    pub side_effect: SideEffectClass,
    /// Its idempotency class, snapshot at authorization.
    pub idempotency_class: IdempotencyClass,
    /// Minimum trust over the request's context.
    pub origin_trust: TrustLevel,
    /// Why approval was required.
    pub reason_code: ReasonCode,
    /// Who the call acts for.
    pub principal: Principal,
    /// The session.
    pub session_id: Uuid,
    /// The run.
    pub run_id: Uuid,
    /// The step.
    pub step_number: i64,
    /// The call id (the bridge's synthesized one inside a turn).
    pub call_id: String,
    /// The bridge turn that holds the call, when a script asked.
    pub turn_id: Option<Uuid>,
    /// Its state.
    pub status: ApprovalStatus,
    /// When it was opened.
    pub requested_at: DateTime<Utc>,
    /// When a caller holding the call (a bridge turn, an MCP request) stops
    /// waiting; `None` when no caller waits.
    pub hold_ends_at: Option<DateTime<Utc>>,
    /// Who decided.
    pub approver: Option<String>,
    /// When.
    pub decided_at: Option<DateTime<Utc>>,
}

/// An UNCERTAIN invocation and, once it left the queue, how it was resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ReviewItem {
    /// The row, with its arguments and watermark.
    pub invocation: InvocationRecord,
    /// The resolution recorded beside it; `None` while pending.
    pub resolution: Option<ReviewRecord>,
}

/// The last thing a server's connection did, from the events outbox.
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectionOutcome {
    /// `mcp.server.connected`, `mcp.server.pinned` or
    /// `mcp.server.disconnected`.
    pub event_type: String,
    /// Why it disconnected, as a stable code.
    pub reason_code: Option<String>,
    /// When.
    pub at: DateTime<Utc>,
}

/// A `mcp_servers` row with whose it is and how its last connection went.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerItem {
    /// The row's id (the page key).
    pub id: Uuid,
    /// The tenant whose row it is.
    pub tenant_id: String,
    /// Whether the tenant wrote it (else an operator server a preparation
    /// recorded for the tenant).
    pub tenant_configured: bool,
    /// The server as configured.
    pub server: McpServerRow,
    /// When the row was first written.
    pub created_at: DateTime<Utc>,
    /// The latest connection event of this server; `None` before any.
    pub last_connection: Option<ConnectionOutcome>,
}

/// One catalog generation of one server of one tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogGenerationItem {
    /// The generation's first row id (the page key).
    pub id: Uuid,
    /// The tenant.
    pub tenant_id: String,
    /// The server.
    pub server_id: String,
    /// sha256 over the sorted declarations.
    pub catalog_hash: String,
    /// When it was first written.
    pub discovered_at: DateTime<Utc>,
    /// Its registry names, sorted.
    pub tools: Vec<String>,
    /// Names of it a later generation no longer had.
    pub withdrawn: Vec<String>,
}

/// A `turns` row: a bridge turn as an operator reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnRecord {
    /// The turn.
    pub turn_id: Uuid,
    /// The tenant.
    pub tenant_id: String,
    /// The session.
    pub session_id: Uuid,
    /// The run.
    pub run_id: Uuid,
    /// The step.
    pub step_number: i64,
    /// The script's hash.
    pub script_sha256: String,
    /// Open, or how it closed.
    pub state: TurnState,
    /// Calls it made, denied ones included (counted at its close).
    pub calls: i64,
    /// When it opened.
    pub opened_at: DateTime<Utc>,
    /// When its token dies.
    pub expires_at: DateTime<Utc>,
    /// When it closed.
    pub closed_at: Option<DateTime<Utc>>,
}

/// One tool's calls over a window, read from the rows so it spans nodes
/// and survives restarts.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolHealth {
    /// The registry name.
    pub tool_name: String,
    /// Calls that ended in the window.
    pub calls: i64,
    /// Of those, the ones that did not succeed, by reason code.
    pub failures: Vec<(String, i64)>,
    /// Of those, the UNCERTAIN ones.
    pub uncertain: i64,
    /// Median time from start to end, of calls that started.
    pub p50_ms: Option<f64>,
    /// 99th percentile of the same.
    pub p99_ms: Option<f64>,
}

/// Lists that span tenants, for the operator. Statuses are the lists' own
/// spellings: an invocation's status, an approval's status, a review item's
/// `pending` or `resolved`, a turn's state.
pub trait OperatorStore: Send + Sync {
    /// Invocation rows by `created_at`, filtered by tenant, tool, status
    /// (`InvocationStatus` spelling) and time.
    fn list_invocations<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        page: PageRequest,
    ) -> BoxFuture<'a, Result<Page<InvocationRecord>, StoreError>>;

    /// One row by id, whichever tenant's, with its events in id order.
    fn invocation_with_events(
        &self,
        id: Uuid,
    ) -> BoxFuture<'_, Result<Option<InvocationStory>, StoreError>>;

    /// Approvals by `requested_at`, each with the call it would allow;
    /// status is an [`ApprovalStatus`] spelling.
    fn list_approvals<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        page: PageRequest,
    ) -> BoxFuture<'a, Result<Page<ApprovalItem>, StoreError>>;

    /// UNCERTAIN invocations by `completed_at`, with their resolution when
    /// resolved; status is `pending` or `resolved`.
    fn list_review_items<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        page: PageRequest,
    ) -> BoxFuture<'a, Result<Page<ReviewItem>, StoreError>>;

    /// Open sessions by `opened_at` (a session's row is deleted when it
    /// ends), with their pinned set's hash and tools; tool and status do
    /// not apply.
    fn list_sessions<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        page: PageRequest,
    ) -> BoxFuture<'a, Result<Page<SessionRecord>, StoreError>>;

    /// Turns by `opened_at`, open and closed; status is a [`TurnState`]
    /// spelling, and tool does not apply.
    fn list_turns<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        page: PageRequest,
    ) -> BoxFuture<'a, Result<Page<TurnRecord>, StoreError>>;

    /// `mcp_servers` rows by `created_at`, operator's and tenants', with
    /// their last connection outcome; `tool_name` filters by server id, and
    /// status does not apply.
    fn list_servers<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        page: PageRequest,
    ) -> BoxFuture<'a, Result<Page<ServerItem>, StoreError>>;

    /// Catalog generations by their first `discovered_at`; `tool_name`
    /// filters by server id, and status does not apply.
    fn list_catalog_generations<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        page: PageRequest,
    ) -> BoxFuture<'a, Result<Page<CatalogGenerationItem>, StoreError>>;

    /// Per tool, the calls that ended at or after `since`: counts, failures
    /// by reason code, UNCERTAIN ones, p50 and p99 latency. Filtered by
    /// tenant and tool; ordered by tool name.
    fn tool_health<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        since: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Vec<ToolHealth>, StoreError>>;
}

/// The `turns` table: written by the bridge as turns open and close.
pub trait TurnStore: Send + Sync {
    /// Records a turn as it opens.
    fn record_turn<'a>(&'a self, turn: &'a TurnRecord) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Records an open turn's close; false when it is not open.
    fn close_turn<'a>(
        &'a self,
        tenant_id: &'a str,
        turn_id: Uuid,
        state: TurnState,
        calls: i64,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Records as expired, at their expiry, the turns still open that
    /// expired before `before`: turns whose node stopped without closing
    /// them (their tokens died with their expiry wherever they were
    /// served). Their call counts stay as recorded. Returns how many.
    fn expire_abandoned_turns(
        &self,
        before: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<u64, StoreError>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_read_back_what_they_wrote() {
        let cursor = Cursor {
            at: DateTime::from_timestamp_micros(1_764_849_600_123_456).unwrap(),
            key: Uuid::new_v4(),
        };
        let text = cursor.to_string();
        assert_eq!(text.split_once('.').unwrap().0, "1764849600123456");
        assert_eq!(Cursor::decode(&text), Ok(cursor));
    }

    #[test]
    fn cursors_not_handed_out_are_refused() {
        let key = Uuid::new_v4().simple().to_string();
        for text in [
            String::new(),
            "1".into(),
            format!(".{key}"),
            format!("-1.{key}"),
            format!("+1.{key}"),
            format!("1.{}", &key[1..]),
            format!("1.{}", Uuid::new_v4()),
            format!("99999999999999999999.{key}"),
            format!("1.{}z", &key[1..]),
        ] {
            assert_eq!(Cursor::decode(&text), Err(InvalidCursor), "{text}");
        }
    }

    #[test]
    fn a_page_says_where_the_next_starts_only_when_one_does() {
        let cursor = |n: &i64| Cursor {
            at: DateTime::from_timestamp_micros(*n).unwrap(),
            key: Uuid::nil(),
        };
        let request = PageRequest {
            limit: 2,
            after: None,
        };
        assert_eq!(request.fetch(), 3);
        let page = request.page(vec![3, 2, 1], cursor);
        assert_eq!(page.items, vec![3, 2]);
        assert_eq!(page.next_cursor, Some(cursor(&2)));
        let last = request.page(vec![1], cursor);
        assert_eq!(last.next_cursor, None);
    }
}
