//! Resuming a suspended control tool with its answer.

use serde_json::json;
use uuid::Uuid;

use super::Pipeline;
use crate::domain::{
    Durability, ReasonCode, SuspensionKind, ToolEventKind, ToolOutcome, ToolOutcomeStatus,
    TrustLevel,
};
use crate::pipeline::call::{Completion, DataPart, Finished, ResultData};
use crate::pipeline::output::{self, Attribution, RenderedPart};
use crate::pipeline::records::{ended_event, nonce, row_event};
use crate::ports::{InvocationState, StoreError, Suspension, TerminalRecord};

impl Pipeline {
    /// The resumption path of a suspended control tool: completes the row
    /// with the user's reply or the child run's result (a child's output is
    /// a model's, so EXTERNAL_UNTRUSTED and enveloped), or ends it failed
    /// with `tool.run_cancelled`. `None` when the row is not a suspended
    /// call of this tenant (already completed, or never suspended).
    pub async fn complete_suspended(
        &self,
        tenant_id: &str,
        invocation_id: Uuid,
        completion: Completion,
    ) -> Result<Option<Finished>, StoreError> {
        let Some(row) = self
            .invocations
            .invocation(tenant_id, invocation_id)
            .await?
        else {
            return Ok(None);
        };
        let InvocationState::Suspended(Suspension { kind, .. }) = &row.state else {
            return Ok(None);
        };
        let (terminal, outcome, content, data, event) = match completion {
            Completion::Answered { text } => {
                let trust = if *kind == SuspensionKind::UserInput {
                    TrustLevel::User
                } else {
                    TrustLevel::ExternalUntrusted
                };
                let data = ResultData {
                    content: vec![DataPart::Text {
                        text: text.clone(),
                        trust,
                    }],
                    structured: None,
                    artifacts: Vec::new(),
                };
                let text = if trust < TrustLevel::InternalTool {
                    let attribution = Attribution {
                        source: row.identity.tool_source,
                        tool: &row.identity.tool_name,
                    };
                    output::envelope(&text, &attribution, &nonce())
                } else {
                    text
                };
                let output_bytes = i64::try_from(text.len()).unwrap_or(i64::MAX);
                let content = vec![RenderedPart::Text { text, trust }];
                let terminal = TerminalRecord {
                    outcome_status: ToolOutcomeStatus::Succeeded,
                    reason_code: None,
                    result: Some(json!({ "content": content, "data": data })),
                    error: None,
                    output_bytes: Some(output_bytes),
                    truncated: false,
                    artifact: None,
                    produced: Vec::new(),
                    durability: Durability::Flushed,
                };
                let mut event = row_event(&row, ToolEventKind::Completed);
                event.outcome_status = Some(ToolOutcomeStatus::Succeeded);
                event.output_bytes = Some(output_bytes);
                let outcome = ToolOutcome::Succeeded {
                    action: row.identity.tool_name.clone(),
                };
                (terminal, outcome, content, Some(data), event)
            }
            Completion::RunCancelled => {
                let code = ReasonCode::ToolRunCancelled;
                (
                    TerminalRecord::without_result(code),
                    ToolOutcome::not_succeeded(row.identity.tool_name.clone(), code),
                    Vec::new(),
                    None,
                    ended_event(&row, code),
                )
            }
        };
        let written = self
            .invocations
            .complete_suspended(
                tenant_id,
                invocation_id,
                &terminal,
                &[event],
                self.clock.now(),
            )
            .await?;
        Ok(written.then_some(Finished {
            invocation_id: Some(invocation_id),
            outcome,
            content,
            data,
            synthesis_only: false,
            retry_after_seconds: None,
            consent: None,
        }))
    }
}
