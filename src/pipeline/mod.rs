//! The one executor and what it stands on: the registry, argument
//! validation, output limiting, breakers and recovery; and the services the
//! edges drive it through: sessions (open, cache, re-pin), batch admission
//! and approval decisions.
//!
//! Uses ports and domain only; never an adapter, so every adapter supplies a
//! `Tool` and re-enters the same function.

pub mod admission;
pub mod approvals;
pub mod artifacts;
pub mod breaker;
mod call;
pub mod executor;
mod guard;
pub mod limits;
pub mod output;
pub mod preparation;
mod records;
pub mod registry;
mod runs;
pub mod sessions;
mod settlement;
pub mod tenant_servers;
pub mod validation;
pub mod worker;

pub use call::{
    CallOutcome, CallRequest, CallerTerms, Completion, ConsentAsked, DataArtifact, DataPart,
    Finished, PipelineSettings, Point, RecoveryReport, Replay, ReplayDivergence, ResultData,
    SUSPENDING, StepObserver, SweepBounds, TOOL_CALL, Unobserved, named_tool,
};
pub use executor::{Pipeline, PipelineParts};
pub use output::RenderedPart;
pub use preparation::{PreparedCatalog, prepare_mcp, register_discoveries};
pub use registry::{
    PinnedTool, PinnedToolSet, RegisteredTool, RegistrationReport, RegistryLimits, Rejection,
    RejectionReason, StartupError, ToolNotFound, ToolRegistry,
};
pub use validation::{ArgumentError, CompiledSchema, SchemaCache, SchemaError, SchemaOrigin};
pub use worker::{Lease, NodePlace, Worker, WorkerError, WorkerSettings};
