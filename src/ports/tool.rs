//! `Tool` and the one context a tool receives.
//!
//! A tool reaches the world only through what is on the context: no store, no
//! registry, no policy engine and no other tool, so code we did not write
//! cannot act outside the pipeline that authorized it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use serde_json::Value;
pub use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::domain::secret::CredentialRef;
use crate::domain::{
    AdvertisedSkill, ArtifactRef, Principal, SecretValue, TargetKind, ToolResult, ToolSpec,
    TrustLevel,
};

/// A boxed, sendable future: what a dyn-compatible async port method returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Anything the pipeline can execute at step 10.
pub trait Tool: Send + Sync {
    /// The declaration this implementation serves.
    fn spec(&self) -> &ToolSpec;

    /// Runs one call. `arguments` are validated and canonical. The future
    /// is polled on the pipeline's own task: it must await, never block the
    /// thread (blocking work belongs on `spawn_blocking`), or its timeout
    /// cannot end it.
    fn execute<'a>(
        &'a self,
        arguments: Value,
        context: ToolExecutionContext,
    ) -> BoxFuture<'a, ToolResult>;

    /// For a tool that acts with each principal's own account at its
    /// server: that server's id, when `principal_id` of `tenant_id` has not
    /// granted it. The call then records nothing and asks for consent.
    fn consent_needed<'a>(
        &'a self,
        _tenant_id: &'a str,
        _principal_id: &'a str,
    ) -> BoxFuture<'a, Option<String>> {
        Box::pin(async { None })
    }
}

/// Where step 10 sends the call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionTarget {
    /// The target's kind, from the spec.
    pub kind: TargetKind,
    /// The server, for MCP targets.
    pub server_id: Option<String>,
    /// The device, for device targets.
    pub device_id: Option<String>,
}

/// The run's workspace, when it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceHandle {
    /// The workspace root every workspace tool is confined to.
    pub root: std::path::PathBuf,
}

/// Why an artifact could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// The store refused or failed.
    #[error("artifact store: {0}")]
    Store(String),
}

/// Creates artifacts scoped to one tenant and run. There is deliberately no
/// read: a tool that could read artifacts by id could read another tenant's.
pub trait ArtifactWriter: Send + Sync {
    /// Stores `bytes` with their trust label and returns the reference.
    fn write<'a>(
        &'a self,
        media_type: &'a str,
        trust: TrustLevel,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<ArtifactRef, ArtifactError>>;
}

/// An artifact's bytes, read as a stream.
pub type ArtifactReader = Box<dyn tokio::io::AsyncRead + Send + Unpin>;

/// Hands out writers scoped to one tenant and run; the pipeline holds this,
/// a tool only ever sees the scoped writer. Reading is for the owner-scoped
/// artifact routes, after the store has shown the artifact is the tenant's.
pub trait ArtifactStore: Send + Sync {
    /// A writer for `tenant_id`'s run `run_id`.
    fn writer(
        &self,
        tenant_id: &str,
        run_id: Uuid,
    ) -> Result<Arc<dyn ArtifactWriter>, ArtifactError>;

    /// The bytes of `artifact_id`, made in `tenant_id`'s run `run_id`.
    fn open<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        artifact_id: Uuid,
    ) -> BoxFuture<'a, Result<ArtifactReader, ArtifactError>>;
}

/// Why a credential could not be resolved. Never carries the value.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The reference names nothing.
    #[error("credential reference {0} does not resolve")]
    Unresolved(CredentialRef),
    /// The backing store failed.
    #[error("credential store: {0}")]
    Store(String),
}

/// Turns a reference into a short-lived value. Values resolved for a call are
/// scrubbed from whatever the tool returns.
pub trait CredentialResolver: Send + Sync {
    /// Resolves `reference`.
    fn resolve<'a>(
        &'a self,
        reference: &'a CredentialRef,
    ) -> BoxFuture<'a, Result<SecretValue, CredentialError>>;
}

/// Why the effect watermark could not be committed: the tool must not start,
/// or must stop before its effect.
#[derive(Debug, thiserror::Error)]
#[error("effect watermark not committed: {0}")]
pub struct WatermarkError(pub String);

/// `mark_effect_sent`: commits `effect_sent_at` in its own short transaction;
/// later calls are no-ops.
pub trait EffectWatermark: Send + Sync {
    /// Marks the effect as possibly sent.
    fn mark_effect_sent(&self) -> BoxFuture<'_, Result<(), WatermarkError>>;
}

/// Everything a tool may reach, and nothing more.
#[derive(Clone)]
pub struct ToolExecutionContext {
    /// The invocation row's id.
    pub invocation_id: Uuid,
    /// The provider's tool-call id, or the bridge's synthesized one.
    pub call_id: String,
    /// The run.
    pub run_id: Uuid,
    /// The session.
    pub session_id: Uuid,
    /// The tenant.
    pub tenant_id: String,
    /// Who the call acts for.
    pub principal: Principal,
    /// The step, shared by every call of one batch.
    pub step_number: u64,
    /// Which execution attempt this is; not part of the key.
    pub attempt_number: u32,
    /// Passed verbatim to remotes that deduplicate on a key.
    pub idempotency_key: String,
    /// Already the minimum of the run's deadline and the call's.
    pub deadline_at: SystemTime,
    /// The effective timeout, not the declared one.
    pub timeout_seconds: f64,
    /// The per-tool output limit.
    pub maximum_output_bytes: u64,
    /// Where the call goes.
    pub target: ExecutionTarget,
    /// The run's workspace, if any.
    pub workspace: Option<WorkspaceHandle>,
    /// Writes artifacts for this run only.
    pub artifacts: Arc<dyn ArtifactWriter>,
    /// Resolves credential references.
    pub credentials: Arc<dyn CredentialResolver>,
    /// Fires when the call must stop.
    pub cancellation: CancellationToken,
    /// The effect watermark.
    pub mark_effect_sent: Arc<dyn EffectWatermark>,
    /// The skills the call's session was shown (`skill.load` loads no
    /// other); none for a call recovery re-runs.
    pub skills: Arc<[AdvertisedSkill]>,
}

impl std::fmt::Debug for ToolExecutionContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolExecutionContext")
            .field("invocation_id", &self.invocation_id)
            .field("call_id", &self.call_id)
            .field("run_id", &self.run_id)
            .field("step_number", &self.step_number)
            .field("attempt_number", &self.attempt_number)
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}
