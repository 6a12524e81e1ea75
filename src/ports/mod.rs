//! The traits the pipeline needs, and the data that crosses them.
//!
//! Owns `Tool` and `ToolExecutionContext` (a tool reaches the world only
//! through what is on the context), the store's per-aggregate traits (the
//! durable record the pipeline's four commits write), and the narrow
//! surfaces of policy, credentials, artifacts, MCP servers, metrics and the
//! clock. Must not know any adapter.

pub mod clock;
pub mod consent;
pub mod egress;
pub mod front;
pub mod mcp;
pub mod metrics;
pub mod policy;
pub mod reload;
pub mod seal;
pub mod store;
pub mod tool;

pub use clock::{Clock, SystemClock};
pub use consent::{
    Consent, ConsentAnswer, ConsentError, ConsentStart, Delegator, Granted, Principals, Revocation,
    Revoked, Subjects,
};
pub use egress::{DialError, Dialed, EgressDialer, EgressStream};
pub use mcp::{DiscoveredTool, DiscoveryOutcome, LoadedSkill, McpServers, ServerDiscovery};
pub use metrics::{Labels, Metrics};
pub use policy::PolicyEngine;
pub use reload::{Reload, ReloadReport};
pub use seal::{SealError, Sealer};
pub use store::{
    ApprovalItem, ApprovalRecord, ApprovalStore, ArtifactRecord, AuthoredSkill, BreakerTally,
    CallIdentity, CatalogEntry, CatalogGeneration, CatalogGenerationItem, CatalogRow, CatalogStore,
    Claim, ConnectionOutcome, ConsentFlow, ConsoleSignIn, ConsoleSignInStore, Cursor, Ended,
    EventRecord, EventStore, Fence, GrantStore, Held, InsertOutcome, InvalidCursor,
    InvocationRecord, InvocationState, InvocationStore, InvocationStory, McpServerRow,
    NewInvocation, OperatorFilter, OperatorStore, Page, PageRequest, PlatformEvent,
    PreparationRecord, QueueDepths, Registration, Renewal, ReviewItem, ReviewRecord, ReviewStore,
    RunOwner, Schema, ServerItem, SessionRecord, SessionStore, SkillStore, SkillWrite,
    SkillWritten, Start, Store, StoreError, StoredArtifact, Suspension, TerminalRecord, ToolEvent,
    ToolHealth, TurnRecord, TurnStore, UpstreamGrant, WorkerLease, WorkerRegistration, WorkerStore,
};
pub use tool::{
    ArtifactError, ArtifactReader, ArtifactStore, ArtifactWriter, BoxFuture, CancellationToken,
    CredentialError, CredentialResolver, EffectWatermark, ExecutionTarget, Tool,
    ToolExecutionContext, WatermarkError, WorkspaceHandle,
};
