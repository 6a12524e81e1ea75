//! What the pipeline, the adapters and the edges count, and the exposition
//! `/metrics` serves. The registry itself is an adapter
//! (`adapters::telemetry`); this is the narrow surface the others see.

/// The content type of the exposition [`Metrics::render`] writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A metric's labels, in the order they are rendered. Never a tenant: that
/// belongs in the row, not in a metric.
pub type Labels = Vec<(&'static str, String)>;

/// Counters and histograms by name and labels.
pub trait Metrics: Send + Sync {
    /// Adds `amount` to a counter.
    fn add(&self, name: &'static str, labels: Labels, amount: u64);

    /// Adds one to a counter.
    fn increment(&self, name: &'static str, labels: Labels) {
        self.add(name, labels, 1);
    }

    /// Records one observation of a histogram.
    fn observe(&self, name: &'static str, labels: Labels, value: f64);

    /// The exposition of everything counted (OpenMetrics text), gauges
    /// read as of now.
    fn render(&self) -> super::BoxFuture<'_, String>;
}

/// Makes a span the child of a caller's W3C `traceparent`, with its
/// `tracestate` when it sent one (the trace exporter's; a no-op where traces
/// are not exported).
pub type TraceContinuation = fn(&tracing::Span, &str, Option<&str>);
