//! The metrics registry: the document's series kept in process and
//! rendered as Prometheus text. Labels are tool, source, status, code and
//! server: never a tenant, which belongs in the row rather than in a metric.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

/// Bucket bounds of `tool_duration_seconds`.
const DURATION_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Bucket bounds of `tool_output_bytes`.
const BYTES_BUCKETS: &[f64] = &[
    64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
];

use crate::ports::metrics::{Labels, Metrics};

#[derive(Debug, Default, Clone)]
struct Histogram {
    buckets: Vec<u64>,
    count: u64,
    sum: f64,
}

#[derive(Default)]
struct State {
    counters: BTreeMap<(&'static str, Labels), u64>,
    histograms: BTreeMap<(&'static str, Labels), Histogram>,
}

/// The registry: counters and histograms by name and labels.
#[derive(Default)]
pub struct MetricsRegistry {
    state: Mutex<State>,
}

fn help(name: &str) -> (&'static str, &'static str) {
    match name {
        "tool_calls_total" => (
            "counter",
            "Calls ended, by tool, source and outcome status.",
        ),
        "tool_failures_total" => (
            "counter",
            "Calls that did not succeed, by tool, source and reason code.",
        ),
        "tool_duration_seconds" => ("histogram", "Execution time of calls that ran."),
        "tool_output_bytes" => ("histogram", "Output size of calls that ran."),
        "tool_truncations_total" => ("counter", "Results excerpted to an artifact."),
        "tool_uncertain_total" => (
            "counter",
            "Calls whose effect is unknown: each one is a human review.",
        ),
        "mcp_requests_total" => ("counter", "MCP requests, by server, method and outcome."),
        "mcp_connect_failures_total" => (
            "counter",
            "MCP connections that failed, by server and reason code.",
        ),
        "bridge_refusals_total" => ("counter", "Bridge requests refused before any call."),
        "mcp_stderr_dropped_bytes_total" => (
            "counter",
            "Bytes of MCP servers' stderr over the logging budget, dropped.",
        ),
        _ => ("untyped", ""),
    }
}

impl MetricsRegistry {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A counter's value (for tests and health).
    pub fn counter(&self, name: &'static str, labels: &Labels) -> u64 {
        self.lock()
            .counters
            .get(&(name, labels.clone()))
            .copied()
            .unwrap_or(0)
    }
}

impl Metrics for MetricsRegistry {
    fn add(&self, name: &'static str, labels: Labels, amount: u64) {
        *self.lock().counters.entry((name, labels)).or_default() += amount;
    }

    /// Records one observation of a histogram.
    fn observe(&self, name: &'static str, labels: Labels, value: f64) {
        let bounds = if name == "tool_output_bytes" {
            BYTES_BUCKETS
        } else {
            DURATION_BUCKETS
        };
        let mut state = self.lock();
        let histogram = state
            .histograms
            .entry((name, labels))
            .or_insert_with(|| Histogram {
                buckets: vec![0; bounds.len()],
                ..Histogram::default()
            });
        for (bucket, bound) in histogram.buckets.iter_mut().zip(bounds) {
            if value <= *bound {
                *bucket += 1;
            }
        }
        histogram.count += 1;
        histogram.sum += value;
    }

    /// The Prometheus text exposition.
    fn render(&self) -> String {
        let state = self.lock();
        let mut out = String::new();
        let mut described = Vec::new();
        let mut describe = |out: &mut String, name: &'static str| {
            if !described.contains(&name) {
                let (kind, text) = help(name);
                let _ = writeln!(out, "# HELP {name} {text}\n# TYPE {name} {kind}");
                described.push(name);
            }
        };
        for ((name, labels), value) in &state.counters {
            describe(&mut out, name);
            let _ = writeln!(out, "{name}{} {value}", render_labels(labels, None));
        }
        for ((name, labels), histogram) in &state.histograms {
            describe(&mut out, name);
            let bounds = if *name == "tool_output_bytes" {
                BYTES_BUCKETS
            } else {
                DURATION_BUCKETS
            };
            for (bound, count) in bounds.iter().zip(&histogram.buckets) {
                let _ = writeln!(
                    out,
                    "{name}_bucket{} {count}",
                    render_labels(labels, Some(&bound.to_string()))
                );
            }
            let _ = writeln!(
                out,
                "{name}_bucket{} {}",
                render_labels(labels, Some("+Inf")),
                histogram.count
            );
            let _ = writeln!(
                out,
                "{name}_sum{} {}",
                render_labels(labels, None),
                histogram.sum
            );
            let _ = writeln!(
                out,
                "{name}_count{} {}",
                render_labels(labels, None),
                histogram.count
            );
        }
        out
    }
}

fn render_labels(labels: &Labels, le: Option<&str>) -> String {
    let mut parts: Vec<String> = labels
        .iter()
        .map(|(name, value)| format!("{name}=\"{}\"", escape(value)))
        .collect();
    if let Some(le) = le {
        parts.push(format!("le=\"{le}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_histograms_render_as_prometheus_text() {
        let metrics = MetricsRegistry::default();
        let labels = vec![
            ("name", "demo.echo".to_owned()),
            ("source", "builtin".to_owned()),
        ];
        metrics.increment("tool_truncations_total", labels.clone());
        metrics.increment("tool_truncations_total", labels.clone());
        metrics.observe("tool_duration_seconds", labels.clone(), 0.02);
        let text = metrics.render();
        assert!(
            text.contains("# TYPE tool_truncations_total counter"),
            "{text}"
        );
        assert!(
            text.contains("tool_truncations_total{name=\"demo.echo\",source=\"builtin\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "tool_duration_seconds_bucket{name=\"demo.echo\",source=\"builtin\",le=\"0.01\"} 0"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "tool_duration_seconds_bucket{name=\"demo.echo\",source=\"builtin\",le=\"0.025\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("tool_duration_seconds_count{name=\"demo.echo\",source=\"builtin\"} 1"),
            "{text}"
        );
        assert_eq!(metrics.counter("tool_truncations_total", &labels), 2);
        assert_eq!(escape("a\"b\n"), "a\\\"b\\n");
    }
}
