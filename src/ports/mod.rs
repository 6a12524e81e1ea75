//! The traits the pipeline needs, and the data that crosses them.
//!
//! Owns `Tool` and `ToolExecutionContext` (a tool reaches the world only
//! through what is on the context), the store's per-aggregate traits (the
//! durable record the pipeline's four commits write), and the narrow
//! surfaces of policy, credentials, artifacts, MCP servers, metrics and the
//! clock. Must not know any adapter.

pub mod clock;
pub mod egress;
pub mod mcp;
pub mod metrics;
pub mod policy;
pub mod store;
pub mod tool;

pub use clock::{Clock, SystemClock};
pub use egress::{DialError, Dialed, EgressDialer, EgressStream};
pub use mcp::{DiscoveredTool, DiscoveryOutcome, LoadedSkill, McpServers, ServerDiscovery};
pub use metrics::{Labels, Metrics};
pub use policy::PolicyEngine;
pub use store::{
    ApprovalRecord, ApprovalStore, ArtifactRecord, AuthoredSkill, BreakerTally, CatalogEntry,
    CatalogGeneration, CatalogRow, CatalogStore, Claim, Ended, EventRecord, EventStore, Fence,
    Held, InsertOutcome, InvocationRecord, InvocationState, InvocationStore, McpServerRow,
    NewInvocation, PlatformEvent, PreparationRecord, QueueDepths, Registration, Renewal,
    ReviewRecord, ReviewStore, Schema, SessionRecord, SessionStore, SkillStore, SkillWrite,
    SkillWritten, Store, StoreError, StoredArtifact, Suspension, TerminalRecord, ToolEvent,
    WorkerLease, WorkerRegistration, WorkerStore,
};
pub use tool::{
    ArtifactError, ArtifactReader, ArtifactStore, ArtifactWriter, BoxFuture, CancellationToken,
    CredentialError, CredentialResolver, EffectWatermark, ExecutionTarget, Tool,
    ToolExecutionContext, WatermarkError, WorkspaceHandle,
};
