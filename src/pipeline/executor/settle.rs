//! Steps 11 to 14: the result checked, excerpted, recorded and rendered;
//! a result the store did not take is kept until it does.

use std::sync::Arc;

use serde_json::{Value, json};
use uuid::Uuid;

use super::Pipeline;
use super::decide::{Conclusion, ResultCheck, result_check};
use super::execute::Attempt;
use crate::domain::recovery::{self, UnwrittenEnd};
use crate::domain::{
    ContentPart, Durability, ReasonCode, SecretValue, ToolFailure, ToolFailureKind, ToolOutcome,
    ToolOutcomeStatus, ToolResult, ToolSpec, TrustLevel,
};
use crate::pipeline::breaker;
use crate::pipeline::call::{CallOutcome, CallRequest, DataArtifact, Finished, Point, ResultData};
use crate::pipeline::output::{self, Attribution, RenderedPart};
use crate::pipeline::records::{content_text, nonce, render_text, row_event, terminal_event_kind};
use crate::pipeline::registry::RegisteredTool;
use crate::pipeline::settlement::Settlement;
use crate::ports::{
    ArtifactWriter, Held, InvocationRecord, StoreError, StoredArtifact, TerminalRecord, ToolEvent,
};

/// What an excerpted result's whole is stored as.
pub(super) const ARTIFACT_MEDIA_TYPE: &str = "text/plain; charset=utf-8";

/// What step 12 made of a conclusion.
struct Rendered {
    /// The conclusion, failed if the result could not be kept whole.
    finish: Conclusion,
    content: Vec<RenderedPart>,
    /// The artifact the whole text went to, with its size.
    artifact: Option<(Uuid, u64)>,
}

impl Pipeline {
    /// Steps 11 to 14.
    pub(super) async fn settle(
        &self,
        request: &CallRequest,
        tool: &Arc<RegisteredTool>,
        row: &Held,
        finish: Conclusion,
        attempt: Attempt,
    ) -> Result<CallOutcome, StoreError> {
        let Attempt {
            executed,
            effect_sent,
        } = attempt;
        let spec = &tool.spec;
        let attribution = Attribution {
            source: spec.source,
            tool: &spec.name,
        };
        // 11. Validate the result: schema, size, trust.
        self.reached(Point::ValidateResult, request);
        let secrets = finish.secrets().to_vec();
        let (finish, text) = checked(tool, finish);

        // 12. Truncate or artifactize: the whole result is stored before the
        // result row and its event.
        self.reached(Point::Artifactize, request);
        let blob_bytes = match &finish {
            Conclusion::Succeeded { result, .. } => blob_bytes(result),
            Conclusion::Failed { .. } => 0,
        };
        let recorded_bytes =
            (text.len() as i64).saturating_add(i64::try_from(blob_bytes).unwrap_or(i64::MAX));
        let trust = match &finish {
            Conclusion::Succeeded { result, .. } => {
                result.output_trust.unwrap_or(TrustLevel::ExternalUntrusted)
            }
            Conclusion::Failed { .. } => TrustLevel::ExternalUntrusted,
        };
        let writer = executed.as_ref().map(|(writer, _)| writer.as_ref());
        let Rendered {
            finish,
            mut content,
            artifact,
        } = self
            .rendered(spec, finish, &text, &secrets, trust, writer)
            .await;
        let (outcome_status, reason_code, error) = ended(&finish, &attribution, &mut content);
        // The same result as data, for programmatic callers.
        let data = match &finish {
            Conclusion::Succeeded { result, .. } => Some(output::result_data(
                result,
                &secrets,
                trust,
                spec.maximum_output_bytes,
                artifact.map(|(id, bytes)| DataArtifact {
                    artifact_id: id.to_string(),
                    media_type: ARTIFACT_MEDIA_TYPE.to_owned(),
                    bytes,
                    trust,
                }),
            )),
            Conclusion::Failed { .. } => None,
        };

        // 13. Persist the result.
        self.reached(Point::PersistResult, request);
        let terminal = TerminalRecord {
            outcome_status,
            reason_code,
            result: Some(json!({ "content": content, "data": data })),
            error,
            output_bytes: executed.as_ref().map(|_| recorded_bytes),
            truncated: artifact.is_some(),
            artifact: artifact.map(|(id, bytes)| StoredArtifact {
                id,
                media_type: ARTIFACT_MEDIA_TYPE.to_owned(),
                bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
                trust,
            }),
            produced: produced(data.as_ref(), artifact),
            durability: Durability::of_tool(spec),
        };
        let mut event = row_event(row, terminal_event_kind(outcome_status));
        event.outcome_status = Some(outcome_status);
        event.reason_code = reason_code;
        // Whether the watermark is set: from this attempt or an earlier one.
        event.effect_sent = effect_sent;
        event.duration_ms = executed.as_ref().map(|(_, ms)| *ms);
        event.output_bytes = terminal.output_bytes;
        event.truncated = terminal.truncated;
        if let Some(answer) = self
            .persist_result(request, row, terminal, event, effect_sent)
            .await?
        {
            return Ok(answer);
        }
        if let (Conclusion::Succeeded { result, .. }, None) = (&finish, reason_code)
            && let Some(evidence_key) = &result.evidence_key
        {
            self.record_evidence(row, &spec.name, evidence_key).await;
        }

        // 14. Render.
        self.reached(Point::Render, request);
        let outcome = match reason_code {
            None => ToolOutcome::Succeeded {
                action: spec.name.clone(),
            },
            Some(code) => ToolOutcome::not_succeeded(spec.name.clone(), code),
        };
        Ok(CallOutcome::Finished(Finished {
            invocation_id: Some(row.identity.id),
            outcome,
            content,
            data,
            synthesis_only: false,
            retry_after_seconds: None,
            consent: None,
        }))
    }

    /// Step 13's commit. `None` once the row holds this attempt's record;
    /// otherwise the answer: the row's own record when another worker took
    /// it, or what it will hold when the store failed under the write.
    async fn persist_result(
        &self,
        request: &CallRequest,
        row: &Held,
        terminal: TerminalRecord,
        event: ToolEvent,
        effect_sent: bool,
    ) -> Result<Option<CallOutcome>, StoreError> {
        let now = self.clock.now();
        let written = self
            .invocations
            .complete_invocation(
                &request.tenant_id,
                row.identity.id,
                row.fence,
                &terminal,
                std::slice::from_ref(&event),
                now,
            )
            .await;
        match written {
            Ok(true) => Ok(None),
            // Another worker took the row over while this attempt ran: its
            // record, not this attempt's, is the call's.
            Ok(false) => self.reread(request, row.identity.id).await.map(Some),
            Err(error) => {
                tracing::error!(error = %error, call_id = %request.call_id, "the result was not recorded; this worker keeps it");
                Ok(Some(self.settle_later(
                    row,
                    terminal,
                    event,
                    effect_sent,
                    now,
                )))
            }
        }
    }

    /// Step 12: the text inline within the budget, or its excerpt with the
    /// whole stored as an artifact; a result that cannot be kept whole
    /// fails rather than being silently cut.
    async fn rendered(
        &self,
        spec: &ToolSpec,
        mut finish: Conclusion,
        text: &str,
        secrets: &[SecretValue],
        trust: TrustLevel,
        writer: Option<&dyn ArtifactWriter>,
    ) -> Rendered {
        let attribution = &Attribution {
            source: spec.source,
            tool: &spec.name,
        };
        let budget = output::inline_budget(
            spec.maximum_output_bytes,
            self.settings.inline_maximum_bytes,
        );
        let too_large = matches!(&finish, Conclusion::Failed { failure, .. } if failure.kind == ToolFailureKind::OutputTooLarge);
        let mut content = Vec::new();
        if (matches!(finish, Conclusion::Succeeded { .. }) || too_large)
            && text.len() as u64 > budget
        {
            // The budget is checked with a reference of the real one's length
            // before anything is written: a limit too small to hold it fails
            // without creating an artifact.
            let placeholder = format!("artifact:{}", Uuid::nil());
            let failure = match (output::excerpt(text, budget, &placeholder), writer) {
                (Err(_), _) => "inline budget too small for an excerpt",
                // A missing artifact writer never silently discards the result.
                (Ok(_), None) => "artifact store unavailable",
                (Ok(_), Some(writer)) => match writer
                    .write(ARTIFACT_MEDIA_TYPE, trust, text.to_owned().into_bytes())
                    .await
                {
                    Ok(reference) => {
                        let id = Uuid::parse_str(&reference.artifact_id)
                            .unwrap_or_else(|_| Uuid::new_v4());
                        // Same length as the placeholder that fit, so this fits.
                        let excerpt = output::excerpt(text, budget, &format!("artifact:{id}"))
                            .unwrap_or_else(|_| output::Excerpt {
                                head: String::new(),
                                marker: format!("[full output: artifact:{id}]"),
                                tail: String::new(),
                            });
                        content.push(render_text(&excerpt.head, trust, attribution));
                        content.push(RenderedPart::Text {
                            text: excerpt.marker,
                            trust: TrustLevel::Platform,
                        });
                        content.push(render_text(&excerpt.tail, trust, attribution));
                        content.push(RenderedPart::Artifact {
                            artifact_id: id.to_string(),
                            bytes: reference.bytes,
                        });
                        return Rendered {
                            finish,
                            content,
                            artifact: Some((id, reference.bytes)),
                        };
                    }
                    // A missing artifact never silently discards the result.
                    Err(_) => "artifact store unavailable",
                },
            };
            finish = Conclusion::failure(
                ToolFailure::new(ToolFailureKind::OutputTooLarge, failure),
                false,
            );
        } else if let Conclusion::Succeeded { result, .. } = &finish {
            for part in &result.content {
                content.push(match part {
                    ContentPart::Text { text } => {
                        render_text(&output::scrub(text, secrets), trust, attribution)
                    }
                    ContentPart::Artifact(reference) => RenderedPart::Artifact {
                        artifact_id: reference.artifact_id.clone(),
                        bytes: reference.bytes,
                    },
                });
            }
        }
        Rendered {
            finish,
            content,
            artifact: None,
        }
    }

    /// The row is settled: evidence lost to a failing store costs a restart
    /// of the loop count, never the answer.
    async fn record_evidence(&self, row: &InvocationRecord, tool_name: &str, evidence_key: &str) {
        if let Err(error) = self
            .invocations
            .record_evidence(
                &row.identity.tenant_id,
                row.identity.run_id,
                tool_name,
                &row.identity.arguments_hash,
                evidence_key,
                breaker::MAXIMUM_RESTARTS,
            )
            .await
        {
            tracing::warn!(error = %error, "evidence key not recorded");
        }
    }

    /// The store failed under a terminal write whose tool ran. The answer
    /// is what the row will hold whichever way it ends, and this worker
    /// keeps the record to write when the store answers again: uncertain
    /// where recovery would end it so (the tool's own conclusion is kept
    /// beside it for the reviewer); otherwise the record as concluded, and
    /// "ask again", which the same call resolves.
    pub(super) fn settle_later(
        &self,
        row: &Held,
        terminal: TerminalRecord,
        event: ToolEvent,
        effect_sent: bool,
        now: chrono::DateTime<chrono::Utc>,
    ) -> CallOutcome {
        let (terminal, event, answer) = match recovery::unwritten_end(
            row.identity.idempotency_class,
            effect_sent,
        ) {
            UnwrittenEnd::Uncertain => {
                let code = ReasonCode::ToolOutcomeUnknown;
                let mut uncertain = TerminalRecord::without_result(code);
                uncertain.error = Some(json!({
                    "kind": "outcome_unknown",
                    "detail": "the store failed before this call's result was recorded; the tool concluded as `concluded` says",
                    "concluded": terminal.outcome_status.as_str(),
                    "concluded_reason_code": terminal.reason_code.map(ReasonCode::as_str),
                }));
                let mut event = event;
                event.kind = terminal_event_kind(ToolOutcomeStatus::Uncertain);
                event.outcome_status = Some(ToolOutcomeStatus::Uncertain);
                event.reason_code = Some(code);
                (uncertain, event, code)
            }
            UnwrittenEnd::AskAgain => (terminal, event, ReasonCode::ToolRecordUnavailable),
        };
        self.settler.hand_over(Settlement {
            tenant_id: row.identity.tenant_id.clone(),
            id: row.identity.id,
            fence: row.fence,
            terminal,
            events: vec![event],
            now,
        });
        CallOutcome::Finished(Finished {
            invocation_id: Some(row.identity.id),
            outcome: ToolOutcome::not_succeeded(row.identity.tool_name.clone(), answer),
            content: Vec::new(),
            data: None,
            synthesis_only: false,
            retry_after_seconds: None,
            consent: None,
        })
    }
}

/// Step 11 on a conclusion: a success is checked against its output schema
/// and the hard ceiling, and its trust clamped to the spec's; the scrubbed
/// text it is measured and rendered by comes with it (a failure has none,
/// and an oversized one keeps its head).
fn checked(tool: &RegisteredTool, finish: Conclusion) -> (Conclusion, String) {
    let Conclusion::Succeeded { result, secrets } = finish else {
        // A runaway the tool itself cut off at the ceiling (an MCP server's
        // answer) keeps its head, already scrubbed, as an oversized success
        // does.
        let head = match &finish {
            Conclusion::Failed { failure, .. }
                if failure.kind == ToolFailureKind::OutputTooLarge =>
            {
                failure.partial_output.clone().unwrap_or_default()
            }
            _ => String::new(),
        };
        return (finish, head);
    };
    let spec = &tool.spec;
    let text = output::scrub(&content_text(&result.content), &secrets);
    let schema_valid = match (&tool.output, &result.structured) {
        (Some(schema), Some(structured)) => {
            schema.validate(Value::Object(structured.clone())).is_ok()
        }
        _ => true,
    };
    let ceiling = output::hard_ceiling(spec.maximum_output_bytes);
    match result_check(
        schema_valid,
        text.len() as u64,
        blob_bytes(&result),
        ceiling,
    ) {
        ResultCheck::OutputInvalid => (
            Conclusion::failure(
                ToolFailure::new(
                    ToolFailureKind::OutputInvalid,
                    "structured result fails the output schema",
                ),
                false,
            ),
            text,
        ),
        ResultCheck::TooLarge => {
            let kept =
                output::prefix_at_boundary(&text, usize::try_from(ceiling).unwrap_or(usize::MAX))
                    .to_owned();
            (
                Conclusion::failure(
                    ToolFailure::new(
                        ToolFailureKind::OutputTooLarge,
                        "output past the hard ceiling",
                    ),
                    false,
                ),
                kept,
            )
        }
        ResultCheck::Valid => {
            let trust = spec.output_trust.clamp_lower(result.output_trust);
            let result = ToolResult {
                output_trust: Some(trust),
                ..result
            };
            (Conclusion::Succeeded { result, secrets }, text)
        }
    }
}

/// Images, audio and blobs, which count toward the output as text does.
fn blob_bytes(result: &ToolResult) -> u64 {
    result
        .content
        .iter()
        .filter_map(|part| match part {
            ContentPart::Artifact(reference) => Some(reference.bytes),
            ContentPart::Text { .. } => None,
        })
        .sum()
}

/// The artifacts the tool made, beside the one its whole text went to.
fn produced(data: Option<&ResultData>, whole: Option<(Uuid, u64)>) -> Vec<StoredArtifact> {
    let whole_id = whole.map(|(id, _)| id.to_string());
    data.iter()
        .flat_map(|data| data.artifacts.iter())
        .filter(|made| Some(&made.artifact_id) != whole_id.as_ref())
        .filter_map(|made| {
            Some(StoredArtifact {
                id: Uuid::parse_str(&made.artifact_id).ok()?,
                media_type: made.media_type.clone(),
                bytes: i64::try_from(made.bytes).unwrap_or(i64::MAX),
                trust: made.trust,
            })
        })
        .collect()
}

/// The outcome a conclusion records: its status, reason code and failure;
/// a failure's remote text joins `content` as enveloped data, never the
/// message.
fn ended(
    finish: &Conclusion,
    attribution: &Attribution<'_>,
    content: &mut Vec<RenderedPart>,
) -> (ToolOutcomeStatus, Option<ReasonCode>, Option<Value>) {
    match finish {
        Conclusion::Succeeded { .. } => (ToolOutcomeStatus::Succeeded, None, None),
        Conclusion::Failed { failure, uncertain } => {
            let code = if *uncertain {
                ReasonCode::ToolOutcomeUnknown
            } else {
                failure.reason_code
            };
            if let Some(external) = &failure.external_text {
                content.push(RenderedPart::Text {
                    text: output::envelope(external, attribution, &nonce()),
                    trust: TrustLevel::ExternalUntrusted,
                });
            }
            (
                code.status(),
                Some(code),
                serde_json::to_value(failure).ok(),
            )
        }
    }
}
