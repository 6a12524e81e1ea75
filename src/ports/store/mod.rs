//! The durable record: what the pipeline's four commits, the effect
//! watermark, deduplication and recovery read and write, one narrow trait
//! per aggregate (invocations, reviews, approvals, sessions, the MCP
//! catalog, events, workers, turns), and the operator's reads across them.
//!
//! A write that spans aggregates (an invocation and the events of its
//! commit, a preparation's servers, catalogs and events) is one method of
//! the aggregate that owns it and one transaction in every adapter. Every
//! write made for an attempt carries its [`Fence`] and changes nothing when
//! the fence is stale. Every tenant-owned read and write names its tenant;
//! adapters enforce it in the query and, on PostgreSQL, with row-level
//! security as well.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::tool::BoxFuture;

mod approvals;
mod catalog;
mod events;
mod grants;
mod invocations;
mod operator;
mod sessions;
mod skills;
mod workers;

pub use approvals::{ApprovalRecord, ApprovalStore};
pub use catalog::{
    CatalogEntry, CatalogGeneration, CatalogRow, CatalogStore, McpServerRow, PreparationRecord,
};
pub use events::{EventRecord, EventStore, PlatformEvent};
pub use grants::{ConsentFlow, GrantStore, UpstreamGrant};
pub use invocations::{
    ArtifactRecord, BreakerTally, CallIdentity, Ended, Held, InsertOutcome, InvocationRecord,
    InvocationState, InvocationStore, NewInvocation, QueueDepths, ReviewRecord, ReviewStore,
    RunOwner, Start, StoredArtifact, Suspension, TerminalRecord, ToolEvent,
};
pub use operator::{
    ApprovalItem, CatalogGenerationItem, ConnectionOutcome, Cursor, DEFAULT_PAGE, InvalidCursor,
    InvocationStory, MAXIMUM_PAGE, OperatorFilter, OperatorStore, Page, PageRequest, ReviewItem,
    ServerItem, ToolHealth, TurnRecord, TurnStore,
};
pub use sessions::{ConsoleSignIn, ConsoleSignInStore, SessionRecord, SessionStore};
pub use skills::{AuthoredSkill, SkillStore, SkillWrite, SkillWritten};
pub use workers::{Registration, Renewal, WorkerLease, WorkerRegistration, WorkerStore};

/// Why the store failed. Messages carry no argument, result or secret.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be reached or the connection broke.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A query failed.
    #[error("store query failed: {0}")]
    Query(String),
    /// A stored value could not be read back.
    #[error("stored value unreadable: {0}")]
    Decode(String),
    /// The schema is behind this build.
    #[error("{0} migration(s) pending; run `toolgate migrate`")]
    MigrationsPending(usize),
    /// The store is set up in a way toolgate cannot work with; the message
    /// says what to change.
    #[error("the store cannot be used as it is set up: {0}")]
    Unsupported(String),
    /// A migration failed or an applied one differs from this build's.
    #[error("migration {version}: {reason}")]
    Migration {
        /// The migration's version.
        version: i64,
        /// What went wrong.
        reason: String,
    },
}

impl StoreError {
    /// Whether retrying the same operation may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

/// The attempt a write is made for: the worker that claimed the row and the
/// row's lease epoch at that claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    /// The claiming worker.
    pub worker_id: Uuid,
    /// Incremented by every claim of the row.
    pub lease_epoch: i64,
}

/// A claim being made: by whom, and until when the lease holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// The claiming worker.
    pub worker_id: Uuid,
    /// The moment of the claim.
    pub now: DateTime<Utc>,
}

/// The schema: this build's migrations.
pub trait Schema: Send + Sync {
    /// Versions of this build's migrations not yet applied.
    fn pending_migrations(&self) -> BoxFuture<'_, Result<Vec<i64>, StoreError>>;

    /// Applies pending migrations; returns the versions applied.
    fn migrate(&self) -> BoxFuture<'_, Result<Vec<i64>, StoreError>>;

    /// Whether the role the store connects as is exempt from row-level
    /// security (a superuser, or `BYPASSRLS`): then tenant isolation rests
    /// on the queries alone. Always false where there is none to bypass.
    fn row_security_bypassed(&self) -> BoxFuture<'_, Result<bool, StoreError>>;
}

/// Every aggregate of one database: what an adapter provides and the
/// composition root hands out, each consumer taking only the narrow traits
/// it uses.
pub trait Store:
    Schema
    + WorkerStore
    + InvocationStore
    + ReviewStore
    + ApprovalStore
    + SessionStore
    + ConsoleSignInStore
    + GrantStore
    + SkillStore
    + CatalogStore
    + EventStore
    + OperatorStore
    + TurnStore
{
}

impl<T> Store for T where
    T: Schema
        + WorkerStore
        + InvocationStore
        + ReviewStore
        + ApprovalStore
        + SessionStore
        + ConsoleSignInStore
        + GrantStore
        + SkillStore
        + CatalogStore
        + EventStore
        + OperatorStore
        + TurnStore
{
}
