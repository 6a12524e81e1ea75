//! Pure conversions between a call, its row and its events: identity and
//! classification only (no arguments, results or external text reach an
//! event), and the outcome a recorded row replays.

use uuid::Uuid;

use super::call::{CallOutcome, CallRequest, Finished, ResultData};
use super::output::{self, Attribution, RenderedPart};
use crate::domain::{
    ContentPart, IdempotencyClass, ReasonCode, ToolEventKind, ToolOutcome, ToolOutcomeStatus,
    ToolSource, TrustLevel,
};
use crate::ports::{InvocationRecord, ToolEvent};

/// Identity fields every event and row of one call shares.
pub(super) struct Identity<'a> {
    pub(super) request: &'a CallRequest,
    pub(super) id: Uuid,
    pub(super) tool_name: &'a str,
    pub(super) tool_version: &'a str,
    pub(super) tool_source: ToolSource,
    pub(super) class: IdempotencyClass,
}

impl Identity<'_> {
    pub(super) fn event(&self, kind: ToolEventKind) -> ToolEvent {
        ToolEvent {
            kind,
            invocation_id: self.id,
            run_id: self.request.run_id,
            step_number: self.request.step_number,
            call_id: self.request.call_id.clone(),
            tool_name: self.tool_name.to_owned(),
            tool_source: self.tool_source,
            tool_version: self.tool_version.to_owned(),
            outcome_status: None,
            reason_code: None,
            idempotency_class: self.class,
            effect_sent: false,
            duration_ms: None,
            output_bytes: None,
            truncated: false,
            parallel_group: self.request.parallel_group,
        }
    }
}

pub(super) fn terminal_event_kind(kind_of: ToolOutcomeStatus) -> ToolEventKind {
    match kind_of {
        ToolOutcomeStatus::Succeeded => ToolEventKind::Completed,
        ToolOutcomeStatus::Failed | ToolOutcomeStatus::Unavailable => ToolEventKind::Failed,
        ToolOutcomeStatus::Denied => ToolEventKind::Denied,
        ToolOutcomeStatus::Uncertain => ToolEventKind::Uncertain,
    }
}

pub(super) fn row_event(row: &InvocationRecord, kind: ToolEventKind) -> ToolEvent {
    ToolEvent {
        kind,
        invocation_id: row.id,
        run_id: row.run_id,
        step_number: row.step_number,
        call_id: row.call_id.clone(),
        tool_name: row.tool_name.clone(),
        tool_source: row.tool_source,
        tool_version: row.tool_version.clone(),
        outcome_status: row.outcome_status(),
        reason_code: row.reason_code,
        idempotency_class: row.idempotency_class,
        effect_sent: row.effect_sent_at.is_some(),
        duration_ms: None,
        output_bytes: row.ended().and_then(|ended| ended.output_bytes),
        truncated: row.ended().is_some_and(|ended| ended.truncated),
        parallel_group: row.parallel_group,
    }
}

/// The terminal event of a row that ends with `code` and no result.
pub(super) fn ended_event(row: &InvocationRecord, code: ReasonCode) -> ToolEvent {
    let status = code.status();
    let mut event = row_event(row, terminal_event_kind(status));
    event.outcome_status = Some(status);
    event.reason_code = Some(code);
    event
}

pub(super) fn denied_event(identity: &Identity<'_>, code: ReasonCode) -> ToolEvent {
    let mut event = identity.event(ToolEventKind::Denied);
    event.outcome_status = Some(ToolOutcomeStatus::Denied);
    event.reason_code = Some(code);
    event
}

/// The outcome a terminal row records, as the model read it the first time.
pub(super) fn recorded(row: &InvocationRecord) -> CallOutcome {
    let result = row.ended().and_then(|ended| ended.result.as_ref());
    let outcome = match (row.outcome_status(), row.reason_code) {
        (Some(ToolOutcomeStatus::Succeeded), _) => ToolOutcome::Succeeded {
            action: row.tool_name.clone(),
        },
        (_, Some(code)) => ToolOutcome::not_succeeded(row.tool_name.clone(), code),
        _ => ToolOutcome::not_succeeded(row.tool_name.clone(), ReasonCode::ToolInternalError),
    };
    let content = result
        .and_then(|result| result.get("content"))
        .and_then(|content| serde_json::from_value::<Vec<StoredPart>>(content.clone()).ok())
        .map(|parts| parts.into_iter().map(StoredPart::into_rendered).collect())
        .unwrap_or_default();
    let data = result
        .and_then(|result| result.get("data"))
        .and_then(|data| serde_json::from_value::<ResultData>(data.clone()).ok());
    CallOutcome::Finished(Finished {
        invocation_id: Some(row.id),
        outcome,
        content,
        data,
        synthesis_only: false,
        retry_after_seconds: None,
    })
}

/// A rendered part as stored in `result`.
#[derive(serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum StoredPart {
    Text { text: String, trust: TrustLevel },
    Artifact { artifact_id: String, bytes: u64 },
}

impl StoredPart {
    fn into_rendered(self) -> RenderedPart {
        match self {
            StoredPart::Text { text, trust } => RenderedPart::Text { text, trust },
            StoredPart::Artifact { artifact_id, bytes } => {
                RenderedPart::Artifact { artifact_id, bytes }
            }
        }
    }
}

/// An outcome for a submission that wrote no row of its own.
pub(super) fn unrecorded(action: String, code: ReasonCode) -> CallOutcome {
    CallOutcome::Finished(Finished {
        invocation_id: None,
        outcome: ToolOutcome::not_succeeded(action, code),
        content: Vec::new(),
        data: None,
        synthesis_only: false,
        retry_after_seconds: None,
    })
}

pub(super) fn content_text(content: &[ContentPart]) -> String {
    let texts: Vec<&str> = content
        .iter()
        .filter_map(|part| match part {
            ContentPart::Text { text } => Some(text.as_str()),
            ContentPart::Artifact(_) => None,
        })
        .collect();
    texts.join("\n")
}

pub(super) fn render_text(
    text: &str,
    trust: TrustLevel,
    attribution: &Attribution<'_>,
) -> RenderedPart {
    if trust <= TrustLevel::ExternalUntrusted {
        RenderedPart::Text {
            text: output::envelope(text, attribution, &nonce()),
            trust,
        }
    } else {
        RenderedPart::Text {
            text: text.to_owned(),
            trust,
        }
    }
}

pub(super) fn nonce() -> String {
    Uuid::new_v4().simple().to_string()
}
