//! Refusals that record nothing, taken before anything of a call is read
//! or written: arguments no store can keep, a rate limit, a run that is
//! another principal's, and a tool acting with the principal's own account
//! at a server it has not granted. A recovering row was admitted when first
//! asked.

use super::Pipeline;
use crate::domain::canonical::holds_nul;
use crate::domain::{ReasonCode, TrustLevel};
use crate::pipeline::call::{CallOutcome, CallRequest, ConsentAsked, named_tool};
use crate::pipeline::output::RenderedPart;
use crate::pipeline::records::unrecorded;

impl Pipeline {
    /// The answer of a call refused before anything is written, if it is.
    pub(super) async fn refused_unrecorded(&self, request: &CallRequest) -> Option<CallOutcome> {
        if request.recovering.is_some() {
            return None;
        }
        // The same on every store: PostgreSQL cannot keep U+0000 as text.
        if holds_nul(&request.arguments) {
            return Some(unrecordable_arguments(request.name.clone()));
        }
        if !request.caller.rate_admitted {
            let named = named_tool(&request.name, &request.arguments);
            let spec = request
                .pinned
                .resolve(named)
                .map(|pinned| &pinned.tool.spec);
            if let Err(limited) =
                self.limits
                    .take(&request.tenant_id, &request.principal.id, named, spec)
            {
                // The action is the tool's registry name when it resolves.
                let action = spec.map_or_else(|| request.name.clone(), |spec| spec.name.clone());
                return Some(rate_limited(action, limited.retry_after_seconds));
            }
        }
        let owned = self
            .owns_run(
                &request.tenant_id,
                &request.principal.id,
                request.session_id,
                request.run_id,
            )
            .await;
        match owned {
            Ok(true) => self.consent_needed(request).await,
            Ok(false) => {
                tracing::debug!(call_id = %request.call_id, "a call named another principal's run");
                Some(unrecorded(
                    request.name.clone(),
                    ReasonCode::PolicyRunNotOwned,
                ))
            }
            Err(error) => {
                tracing::error!(error = %error, call_id = %request.call_id, "store failure in the pipeline");
                Some(unrecorded(
                    request.name.clone(),
                    ReasonCode::ToolRecordUnavailable,
                ))
            }
        }
    }
}

impl Pipeline {
    /// A call of a tool that acts with the principal's own account at a
    /// server it has not granted: nothing runs and nothing is recorded, so
    /// the same call asked again after consent is a call like any other.
    async fn consent_needed(&self, request: &CallRequest) -> Option<CallOutcome> {
        let pages = self.consent_pages.as_deref()?;
        let named = named_tool(&request.name, &request.arguments);
        let pinned = request.pinned.resolve(named)?;
        let server_id = pinned
            .tool
            .tool
            .consent_needed(&request.tenant_id, &request.principal.id)
            .await?;
        // A server id is an identifier: nothing in it needs encoding.
        let url = format!("{pages}{server_id}");
        let mut outcome = unrecorded(
            pinned.tool.spec.name.clone(),
            ReasonCode::ToolConsentRequired,
        );
        if let CallOutcome::Finished(finished) = &mut outcome {
            finished.content = vec![RenderedPart::Text {
                text: format!(
                    "This tool acts with the user's own account at {server_id}, which the user \
                     has not granted. Nothing was run. Ask the user to open {url} and consent, \
                     then ask for the same call again."
                ),
                trust: TrustLevel::Platform,
            }];
            finished.consent = Some(Box::new(ConsentAsked { server_id, url }));
        }
        Some(outcome)
    }
}

/// A call whose arguments hold U+0000: invalid, and nothing recorded.
fn unrecordable_arguments(action: String) -> CallOutcome {
    let mut outcome = unrecorded(action, ReasonCode::ToolArgumentsInvalid);
    if let CallOutcome::Finished(finished) = &mut outcome {
        finished.content = vec![RenderedPart::Text {
            text: "a string of the arguments holds the character U+0000, which is never accepted"
                .to_owned(),
            trust: TrustLevel::Platform,
        }];
    }
    outcome
}

/// A call the rate limits refused: nothing recorded, and when to ask again.
fn rate_limited(action: String, retry_after_seconds: u64) -> CallOutcome {
    let mut outcome = unrecorded(action, ReasonCode::ToolRateLimited);
    if let CallOutcome::Finished(finished) = &mut outcome {
        finished.retry_after_seconds = Some(retry_after_seconds);
    }
    outcome
}
