//! Telemetry: the metrics registry behind the `Metrics` port, and the
//! decorator that counts the document's tool metrics from the tool events
//! the invocation store commits.

pub mod budget;
mod metered;
mod metrics;
pub mod otlp;

pub use budget::LogBudget;
pub use metered::MeteredInvocations;
pub use metrics::{LabelBounds, MetricsRegistry, Sample, Sampler};
