//! The pipeline's vocabulary: the points it passes, what an entry point
//! submits and gets back, and the names of the control tools the executor
//! treats specially.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::output::RenderedPart;
use super::registry::PinnedToolSet;
use crate::domain::{
    AgentSpec, ArgumentTrust, Principal, ReasonCode, SuspensionKind, ToolOutcome,
    ToolOutcomeStatus, TrustLevel,
};
use crate::ports::Fence;

/// A place in the pipeline an observer is told about: the fourteen steps as
/// they are entered, and the watermark's commit inside step 10.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Point {
    /// 1: resolve the registered tool.
    Resolve,
    /// 2: check the tool is enabled for the agent.
    Enabled,
    /// 3: check the principal's scopes.
    Scopes,
    /// 4: validate the arguments.
    Validate,
    /// 5: normalize: canonical form, hash, key.
    Normalize,
    /// 6: evaluate policy.
    Policy,
    /// 7: request approval if needed.
    Approval,
    /// 8: persist intent (commit).
    PersistIntent,
    /// 9: claim for execution (commit).
    Claim,
    /// 10: execute (the watermark commits first for any side effect).
    Execute,
    /// Inside 10: the watermark is committed and the tool is about to start.
    WatermarkCommitted,
    /// 11: validate the result.
    ValidateResult,
    /// 12: truncate or artifactize.
    Artifactize,
    /// 13: persist the result (commit).
    PersistResult,
    /// 14: render the outcome.
    Render,
}

impl Point {
    /// A stable name, for failpoints and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Point::Resolve => "resolve",
            Point::Enabled => "enabled",
            Point::Scopes => "scopes",
            Point::Validate => "validate",
            Point::Normalize => "normalize",
            Point::Policy => "policy",
            Point::Approval => "approval",
            Point::PersistIntent => "persist_intent",
            Point::Claim => "claim",
            Point::Execute => "execute",
            Point::WatermarkCommitted => "watermark_committed",
            Point::ValidateResult => "validate_result",
            Point::Artifactize => "artifactize",
            Point::PersistResult => "persist_result",
            Point::Render => "render",
        }
    }

    /// The point a name denotes.
    pub fn parse(name: &str) -> Option<Point> {
        Point::ALL.into_iter().find(|point| point.as_str() == name)
    }

    /// Every point, in pipeline order.
    pub const ALL: [Point; 15] = [
        Point::Resolve,
        Point::Enabled,
        Point::Scopes,
        Point::Validate,
        Point::Normalize,
        Point::Policy,
        Point::Approval,
        Point::PersistIntent,
        Point::Claim,
        Point::Execute,
        Point::WatermarkCommitted,
        Point::ValidateResult,
        Point::Artifactize,
        Point::PersistResult,
        Point::Render,
    ];
}

/// Watches the pipeline pass its points: tests record the sequence, the
/// crash harness aborts the process at one.
pub trait StepObserver: Send + Sync {
    /// The call `call_id` reached `point`.
    fn reached(&self, point: Point, call_id: &str);
}

/// An observer that does nothing.
#[derive(Debug, Default)]
pub struct Unobserved;

impl StepObserver for Unobserved {
    fn reached(&self, _: Point, _: &str) {}
}

/// Pipeline-wide settings from configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipelineSettings {
    /// The model-visible admission ceiling.
    pub inline_maximum_bytes: u64,
}

/// One call, as an entry point submits it.
#[derive(Debug, Clone)]
pub struct CallRequest {
    /// The tenant.
    pub tenant_id: String,
    /// The session.
    pub session_id: Uuid,
    /// The run.
    pub run_id: Uuid,
    /// The step (shared by the batch).
    pub step_number: i64,
    /// The provider's call id, or the bridge's.
    pub call_id: String,
    /// A registry name or its wire alias.
    pub name: String,
    /// The model's arguments.
    pub arguments: Value,
    /// Who the call acts for.
    pub principal: Principal,
    /// The agent's configuration.
    pub agent: AgentSpec,
    /// The session's pinned set: resolution is against what was advertised.
    pub pinned: Arc<PinnedToolSet>,
    /// Minimum trust over the request's context items.
    pub origin_trust: TrustLevel,
    /// Per-argument trust, carried from construction.
    pub argument_trust: ArgumentTrust,
    /// The run's deadline.
    pub deadline_at: Option<DateTime<Utc>>,
    /// The batch, when parallel.
    pub parallel_group: Option<Uuid>,
    /// Set only by recovery: the fence under which it took the row over.
    pub recovering: Option<Fence>,
    /// What the entry point lets its caller do with the call.
    pub caller: CallerTerms,
}

/// What an entry point lets its caller do with a call beyond asking.
#[derive(Debug, Clone, Default)]
pub struct CallerTerms {
    /// Fired when the caller takes the call back (an MCP client's
    /// `notifications/cancelled`): until its intent or a refusal is
    /// recorded the call then records nothing and ends
    /// [`CallOutcome::Withdrawn`]; after that the pipeline's rules hold.
    pub withdrawn: Option<tokio_util::sync::CancellationToken>,
    /// The caller cannot name its calls (an MCP client without
    /// `toolgate/call_id`): a call that needs an approval while a call of
    /// the run with the same tool and canonical arguments already waits for
    /// one is that call, so asking again never makes a second approval.
    pub resumes_waiting: bool,
    /// The call a replayed turn recorded at this call's ordinal (same run,
    /// step, script and ordinal, so the same call id): a call that differs
    /// from it (another tool, or other arguments) and may act is not
    /// silently a new call.
    pub replay: Option<Replay>,
    /// The call passed the rate limits when it was first asked and is
    /// asked again only to resume (its approval was decided while its
    /// caller waited): it is not counted twice.
    pub rate_admitted: bool,
}

/// What a replayed turn recorded at a call's ordinal, and what is done when
/// the call now differs from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// The recorded invocation.
    pub invocation_id: Uuid,
    /// Its tool.
    pub tool_name: String,
    /// Its canonical arguments' hash.
    pub arguments_hash: String,
    /// What a divergence gets.
    pub divergence: ReplayDivergence,
}

pub use crate::domain::policy::ReplayDivergence;

impl CallerTerms {
    fn withdrawn(&self) -> bool {
        self.withdrawn
            .as_ref()
            .is_some_and(tokio_util::sync::CancellationToken::is_cancelled)
    }
}

impl CallRequest {
    /// Whether the caller has taken the call back.
    pub(super) fn withdrawn(&self) -> bool {
        self.caller.withdrawn()
    }
}

/// A succeeded call's result as data, for programmatic callers (a script on
/// the bridge): text as text, not enveloped, complete up to the tool's
/// `maximum_output_bytes`; every other block, and text past that, as an
/// artifact reference; each part with its trust label, so whoever carries
/// what a script prints back to a model can label it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ResultData {
    /// The content blocks, in order.
    pub content: Vec<DataPart>,
    /// The tool's structured result, when it has one.
    pub structured: Option<Value>,
    /// Every artifact the call produced (the whole-result capture among
    /// them), readable through the owner-scoped artifact routes.
    pub artifacts: Vec<DataArtifact>,
}

/// One content block as data.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum DataPart {
    /// Text, whole.
    Text {
        /// The text.
        text: String,
        /// Its trust label.
        trust: TrustLevel,
    },
    /// A block held as an artifact (an image, a blob, or text too long to
    /// carry inline).
    Artifact {
        /// The artifact.
        artifact_id: String,
        /// Its media type.
        media_type: String,
        /// Its size.
        bytes: u64,
        /// Its trust label.
        trust: TrustLevel,
    },
}

impl DataPart {
    /// The block an artifact stands in for.
    pub fn artifact(artifact: &DataArtifact) -> DataPart {
        DataPart::Artifact {
            artifact_id: artifact.artifact_id.clone(),
            media_type: artifact.media_type.clone(),
            bytes: artifact.bytes,
            trust: artifact.trust,
        }
    }
}

/// An artifact a call produced.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DataArtifact {
    /// The artifact.
    pub artifact_id: String,
    /// Its media type.
    pub media_type: String,
    /// Its size.
    pub bytes: u64,
    /// Its trust label.
    pub trust: TrustLevel,
}

/// A call's end, as the model reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    /// The row, when one was written or found.
    pub invocation_id: Option<Uuid>,
    /// The six-field (or success) outcome.
    pub outcome: ToolOutcome,
    /// What the model reads beside it.
    pub content: Vec<RenderedPart>,
    /// A success's result as data, for programmatic callers; recorded with
    /// the row, so a replay returns it too.
    pub data: Option<ResultData>,
    /// An identical-call count sits one below the loop threshold after this
    /// call: the next model turn must answer from what it has.
    pub synthesis_only: bool,
    /// A rate-limited call's wait before the same call may be admitted:
    /// whole seconds, at least one. Only `tool.rate_limited` carries it.
    pub retry_after_seconds: Option<u64>,
    /// Where the person behind the principal consents, for a call that
    /// needs a grant it does not hold. Only `tool.consent_required` carries
    /// it; nothing of the call was recorded.
    pub consent: Option<Box<ConsentAsked>>,
}

/// The consent a call asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsentAsked {
    /// The server that acts with the person's own account.
    pub server_id: String,
    /// toolgate's consent page for it.
    pub url: String,
}

impl Finished {
    /// Whether this outcome fails the run (ToolPolicyDenied: the third
    /// identical denied proposal).
    pub fn fails_run(&self) -> bool {
        self.outcome.reason_code() == Some(ReasonCode::PolicyBreakerRepeatedDenial)
    }
}

/// What an entry point gets back.
#[derive(Debug, Clone, PartialEq)]
pub enum CallOutcome {
    /// The call ended.
    Finished(Finished),
    /// A control tool suspended the call: it ends when its answer (a user's
    /// reply, a child run's result) completes it through
    /// [`Pipeline::complete_suspended`].
    Suspended {
        /// The suspended row.
        invocation_id: Uuid,
        /// What answers it.
        kind: SuspensionKind,
        /// The question or child run the answer must name.
        reference: String,
    },
    /// The call waits for a human; submitting it again resumes it.
    Pending {
        /// The waiting row.
        invocation_id: Uuid,
        /// The approval to decide.
        approval_id: Uuid,
    },
    /// The caller took the call back before anything of it was recorded.
    Withdrawn,
}

impl CallOutcome {
    /// The end, if the call has one.
    pub fn finished(&self) -> Option<&Finished> {
        match self {
            CallOutcome::Finished(finished) => Some(finished),
            CallOutcome::Pending { .. }
            | CallOutcome::Suspended { .. }
            | CallOutcome::Withdrawn => None,
        }
    }

    /// The outcome status, absent while pending.
    pub fn status(&self) -> Option<ToolOutcomeStatus> {
        self.finished().map(|finished| finished.outcome.status())
    }
}

/// What one recovery sweep may take: rows per round, rounds, and time. A
/// round once begun is finished (its rows are this worker's), but none
/// begins after `time` has passed since the sweep began; the next sweep
/// takes the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepBounds {
    /// Rows taken over per round.
    pub batch: i64,
    /// Rounds at most.
    pub rounds: usize,
    /// No round begins after this long.
    pub time: std::time::Duration,
}

/// What recovery did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Rows taken over.
    pub taken: usize,
    /// Of those, ended uncertain.
    pub uncertain: usize,
}

/// How a suspended control tool ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// The user replied, or the child run finished, with this text.
    Answered {
        /// The reply or the child's result.
        text: String,
    },
    /// The run was cancelled while the call waited.
    RunCancelled,
}

/// The control tools that suspend, and the marker each leaves on its row.
pub const SUSPENDING: &[(&str, SuspensionKind)] = &[
    ("conversation.ask_user", SuspensionKind::UserInput),
    ("delegate.run", SuspensionKind::ChildRun),
];

/// The registry name of the wrapper ADR-0123 adds.
pub const TOOL_CALL: &str = "tool.call";

/// The tool a call names, as the executor will run it: `tool.call` is the
/// tool in its `name` argument (ADR-0123), anything else is itself. What an
/// admission rule judges, before the executor has validated anything.
pub fn named_tool<'a>(name: &'a str, arguments: &'a Value) -> &'a str {
    if name == TOOL_CALL {
        arguments
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
    } else {
        name
    }
}
