//! The one executor and what it stands on: the registry, argument validation,
//! output limiting, breakers and recovery.
//!
//! Uses ports and domain only; never an adapter, so every adapter supplies a
//! `Tool` and re-enters the same function.

pub mod breaker;
pub mod executor;
pub mod metered;
pub mod output;
pub mod preparation;
pub mod recovery;
pub mod registry;
pub mod validation;
pub mod worker;

pub use executor::{
    CallOutcome, CallRequest, Finished, Pipeline, PipelineParts, PipelineSettings, Point,
    RecoveryReport, StepObserver, Unobserved,
};
pub use metered::MeteredStore;
pub use output::RenderedPart;
pub use preparation::{PreparedCatalog, prepare_mcp, register_discoveries};
pub use registry::{
    PinnedTool, PinnedToolSet, RegisteredTool, RegistrationReport, RegistryLimits, Rejection,
    RejectionReason, StartupError, ToolNotFound, ToolRegistry,
};
pub use validation::{ArgumentError, CompiledSchema, SchemaCache, SchemaError, SchemaOrigin};
pub use worker::{Worker, WorkerSettings};
