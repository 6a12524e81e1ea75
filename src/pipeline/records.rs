//! Pure conversions between a call, its row and its events: identity and
//! classification only (no arguments, results or external text reach an
//! event), and the outcome a recorded row replays.

use uuid::Uuid;

use super::call::{CallOutcome, Finished, ResultData};
use super::output::{self, Attribution, RenderedPart};
use crate::domain::{
    ContentPart, ReasonCode, ToolEventKind, ToolOutcome, ToolOutcomeStatus, TrustLevel,
};
use crate::ports::{CallIdentity, InvocationRecord, ToolEvent};

pub(super) fn terminal_event_kind(kind_of: ToolOutcomeStatus) -> ToolEventKind {
    match kind_of {
        ToolOutcomeStatus::Succeeded => ToolEventKind::Completed,
        ToolOutcomeStatus::Failed | ToolOutcomeStatus::Unavailable => ToolEventKind::Failed,
        ToolOutcomeStatus::Denied => ToolEventKind::Denied,
        ToolOutcomeStatus::Uncertain => ToolEventKind::Uncertain,
    }
}

pub(super) fn row_event(row: &InvocationRecord, kind: ToolEventKind) -> ToolEvent {
    let mut event = row.identity.event(kind);
    event.outcome_status = row.outcome_status();
    event.reason_code = row.reason_code;
    event.effect_sent = row.effect_sent_at.is_some();
    event.output_bytes = row.ended().and_then(|ended| ended.output_bytes);
    event.truncated = row.ended().is_some_and(|ended| ended.truncated);
    event
}

/// The terminal event of a row that ends with `code` and no result.
pub(super) fn ended_event(row: &InvocationRecord, code: ReasonCode) -> ToolEvent {
    let status = code.status();
    let mut event = row_event(row, terminal_event_kind(status));
    event.outcome_status = Some(status);
    event.reason_code = Some(code);
    event
}

pub(super) fn denied_event(identity: &CallIdentity, code: ReasonCode) -> ToolEvent {
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
            action: row.identity.tool_name.clone(),
        },
        (_, Some(code)) => ToolOutcome::not_succeeded(row.identity.tool_name.clone(), code),
        _ => ToolOutcome::not_succeeded(
            row.identity.tool_name.clone(),
            ReasonCode::ToolInternalError,
        ),
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
        invocation_id: Some(row.identity.id),
        outcome,
        content,
        data,
        synthesis_only: false,
        retry_after_seconds: None,
        consent: None,
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
        consent: None,
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
