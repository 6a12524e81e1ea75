//! The traits the pipeline needs, and the data that crosses them.
//!
//! Owns `Tool` and `ToolExecutionContext` (a tool reaches the world only
//! through what is on the context), and `Store` (the durable record the
//! pipeline's four commits write). Must not know any adapter.

pub mod clock;
pub mod mcp;
pub mod metrics;
pub mod policy;
pub mod store;
pub mod tool;

pub use clock::{Clock, SystemClock};
pub use mcp::{DiscoveredTool, DiscoveryOutcome, LoadedSkill, McpServers, ServerDiscovery};
pub use policy::PolicyEngine;
pub use store::{
    ApprovalRecord, BreakerTally, CatalogEntry, CatalogGeneration, CatalogRow, Claim, EventRecord,
    Fence, InsertOutcome, InvocationRecord, McpServerRow, NewInvocation, PlatformEvent,
    PreparationRecord, ReviewRecord, SessionRecord, Store, StoreError, StoredArtifact,
    TerminalRecord, ToolEvent, WorkerLease,
};
pub use tool::{
    ArtifactError, ArtifactStore, ArtifactWriter, BoxFuture, CancellationToken, CredentialError,
    CredentialResolver, EffectWatermark, ExecutionTarget, Tool, ToolExecutionContext,
    WatermarkError, WorkspaceHandle,
};
