//! The metrics registry on `prometheus-client`: the design's series with a
//! `toolgate_` prefix, the gauges operators ask for first (sampled when
//! scraped), the process's own and the build's, in the OpenMetrics text
//! format. Labels are tool, source, status, code and server: never a tenant,
//! which belongs in the row rather than in a metric.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::encoding::text::encode;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::ports::BoxFuture;
use crate::ports::metrics::{Labels, Metrics};

/// The prefix of every series.
pub const PREFIX: &str = "toolgate";

/// Bucket bounds of durations (seconds).
const DURATION_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Bucket bounds of `tool_output_bytes`.
const BYTES_BUCKETS: &[f64] = &[
    64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
];
/// Bucket bounds of store commits (seconds).
const COMMIT_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// The counters: name (with `_total`, as callers count them) and help.
const COUNTERS: &[(&str, &str)] = &[
    (
        "tool_calls_total",
        "Calls ended, by tool, source and outcome status",
    ),
    (
        "tool_failures_total",
        "Calls that did not succeed, by tool, source and reason code",
    ),
    ("tool_truncations_total", "Results excerpted to an artifact"),
    (
        "tool_uncertain_total",
        "Calls whose effect is unknown: each one is a human review",
    ),
    (
        "mcp_requests_total",
        "MCP requests, by server, method and outcome",
    ),
    (
        "mcp_connect_failures_total",
        "MCP connections that failed, by server and reason code",
    ),
    (
        "bridge_refusals_total",
        "Bridge requests refused before any call",
    ),
    (
        "rate_limited_total",
        "Calls a rate limit refused (nothing recorded), by the limit's scope",
    ),
    (
        "mcp_stderr_dropped_bytes_total",
        "Bytes of MCP servers' stderr over the logging budget, dropped",
    ),
];

/// The histograms: name, help, buckets.
const HISTOGRAMS: &[(&str, &str, &[f64])] = &[
    (
        "tool_duration_seconds",
        "Execution time of calls that ran",
        DURATION_BUCKETS,
    ),
    (
        "tool_output_bytes",
        "Output size of calls that ran",
        BYTES_BUCKETS,
    ),
    (
        "store_commit_seconds",
        "Time of the pipeline's store commits, by operation",
        COMMIT_BUCKETS,
    ),
];

/// The gauges: name, help, and whether they carry labels. (The library
/// ends every help text with a full stop.)
const GAUGES: &[(&str, &str, bool)] = &[
    (
        "requests_in_flight",
        "Requests in flight on the control API and the bridge",
        false,
    ),
    ("turns_open", "Orchestration turns open", false),
    (
        "mcp_connections",
        "Live MCP connections: operator servers by id, tenant servers together",
        true,
    ),
    (
        "review_queue_depth",
        "UNCERTAIN calls not yet resolved by a human",
        false,
    ),
    (
        "approvals_pending",
        "Approvals waiting for a decision",
        false,
    ),
    (
        "build_info",
        "The build: always 1, its version and revision as labels",
        true,
    ),
    (
        "process_resident_memory_bytes",
        "Resident memory of the process",
        false,
    ),
    (
        "process_open_fds",
        "File descriptors the process holds",
        false,
    ),
    (
        "process_start_time_seconds",
        "When the process started, in seconds since the epoch",
        false,
    ),
];

/// One gauge reading: name, labels, value.
pub type Sample = (&'static str, Labels, i64);

/// Reads gauges when the registry is scraped (counts held elsewhere: the
/// turns, the connections, the store's queues).
pub trait Sampler: Send + Sync {
    /// The readings of this moment.
    fn sample(&self) -> BoxFuture<'_, Vec<Sample>>;
}

type Owned = Vec<(String, String)>;
type HistogramFamily = Family<Owned, Histogram, Buckets>;

/// Makes a family's histograms with one set of bucket bounds.
#[derive(Clone)]
struct Buckets(&'static [f64]);

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

/// Distinct MCP tool names that become `name` label values; past it, a
/// new one is counted under [`OTHER_TOOLS`].
pub const MAXIMUM_TOOL_NAMES: usize = 1_000;
/// Where tool names past [`MAXIMUM_TOOL_NAMES`] are counted.
pub const OTHER_TOOLS: &str = "other";
/// Where the tools of tenants' servers are counted, unless the operator
/// names the server.
pub const TENANT_SERVER_TOOLS: &str = "mcp.tenant_servers";
/// Where tenants' servers are counted, unless the operator names them (the
/// `server` label).
pub const TENANT_SERVERS: &str = "tenant_servers";

/// What may become a label value: series are bounded by configuration,
/// whatever tenants and scripts send. Unknown tool names are folded by the
/// caller ([`super::metered::UNKNOWN_TOOL`]); tenant servers and their
/// tools aggregate unless the operator names them; and at most
/// [`MAXIMUM_TOOL_NAMES`] MCP tool names are ever labels (the builtins'
/// are the build's).
#[derive(Debug, Clone, Default)]
pub struct LabelBounds {
    /// Servers whose ids (and tools' names) are labels of their own: the
    /// operator's, and the tenant servers `ops.metrics_tenant_servers`
    /// names.
    pub named_servers: std::collections::BTreeSet<String>,
}

/// The registry.
pub struct MetricsRegistry {
    registry: Registry,
    counters: HashMap<&'static str, Family<Owned, Counter>>,
    histograms: HashMap<&'static str, HistogramFamily>,
    gauges: HashMap<&'static str, Family<Owned, Gauge>>,
    plain: HashMap<&'static str, Gauge>,
    /// CPU seconds, user and system: a float counter, as Prometheus's own
    /// `process_cpu_seconds_total`, so `rate()` reads it in cores.
    cpu_seconds: Counter<f64, AtomicU64>,
    samplers: Mutex<Vec<Arc<dyn Sampler>>>,
    bounds: LabelBounds,
    /// The tool names admitted as labels so far.
    tool_names: Mutex<std::collections::HashSet<String>>,
}

impl Default for MetricsRegistry {
    fn default() -> Self {
        MetricsRegistry::new(env!("CARGO_PKG_VERSION"), env!("TOOLGATE_REVISION"))
    }
}

impl MetricsRegistry {
    /// A registry of every series, with the build's version and revision.
    pub fn new(version: &str, revision: &str) -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let mut counters = HashMap::new();
        for (name, help) in COUNTERS {
            let family = Family::<Owned, Counter>::default();
            // The library writes the `_total` suffix itself.
            registry.register(name.trim_end_matches("_total"), *help, family.clone());
            counters.insert(*name, family);
        }
        let mut histograms = HashMap::new();
        for (name, help, buckets) in HISTOGRAMS {
            let family: HistogramFamily = Family::new_with_constructor(Buckets(buckets));
            registry.register(*name, *help, family.clone());
            histograms.insert(*name, family);
        }
        let mut gauges = HashMap::new();
        let mut plain = HashMap::new();
        for (name, help, labelled) in GAUGES {
            if *labelled {
                let family = Family::<Owned, Gauge>::default();
                registry.register(*name, *help, family.clone());
                gauges.insert(*name, family);
            } else {
                let gauge = Gauge::default();
                registry.register(*name, *help, gauge.clone());
                plain.insert(*name, gauge);
            }
        }
        let cpu_seconds = Counter::<f64, AtomicU64>::default();
        registry.register(
            "process_cpu_seconds",
            "CPU time the process has used, user and system",
            cpu_seconds.clone(),
        );
        let metrics = MetricsRegistry {
            registry,
            cpu_seconds,
            counters,
            histograms,
            gauges,
            plain,
            samplers: Mutex::new(Vec::new()),
            bounds: LabelBounds::default(),
            tool_names: Mutex::new(std::collections::HashSet::new()),
        };
        metrics.set(
            "build_info",
            vec![
                ("version", version.to_owned()),
                ("revision", revision.to_owned()),
            ],
            1,
        );
        metrics
    }

    /// The same registry, its labels held to `bounds`.
    pub fn with_bounds(mut self, bounds: LabelBounds) -> Self {
        self.bounds = bounds;
        self
    }

    /// A counter's value (for tests and health).
    pub fn counter(&self, name: &'static str, labels: &Labels) -> u64 {
        self.counters.get(name).map_or(0, |family| {
            family.get_or_create(&self.bounded(labels)).get()
        })
    }

    /// `labels` with every value that is not the operator's to choose
    /// folded as [`LabelBounds`] says.
    fn bounded(&self, labels: &Labels) -> Owned {
        labels
            .iter()
            .map(|(key, value)| {
                let value = match *key {
                    "name" => self.tool_label(value),
                    "server" if self.bounds.named_servers.contains(value) => value.clone(),
                    "server" => TENANT_SERVERS.to_owned(),
                    _ => value.clone(),
                };
                ((*key).to_owned(), value)
            })
            .collect()
    }

    fn tool_label(&self, name: &str) -> String {
        // A name outside `mcp.` is the build's (a builtin, or the fold of
        // every unknown name): the build bounds them.
        let Some(server) = name
            .strip_prefix("mcp.")
            .and_then(|rest| rest.split('.').next())
        else {
            return name.to_owned();
        };
        if !self.bounds.named_servers.contains(server) {
            return TENANT_SERVER_TOOLS.to_owned();
        }
        let mut admitted = self
            .tool_names
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if admitted.contains(name) {
            return name.to_owned();
        }
        if admitted.len() < MAXIMUM_TOOL_NAMES {
            admitted.insert(name.to_owned());
            return name.to_owned();
        }
        OTHER_TOOLS.to_owned()
    }

    /// Adds a source of gauge readings, read at every scrape.
    pub fn add_sampler(&self, sampler: Arc<dyn Sampler>) {
        self.samplers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(sampler);
    }

    /// Sets a gauge.
    pub fn set(&self, name: &'static str, labels: Labels, value: i64) {
        if let Some(gauge) = self.plain.get(name) {
            gauge.set(value);
        } else if let Some(family) = self.gauges.get(name) {
            family.get_or_create(&self.bounded(&labels)).set(value);
        }
    }

    fn sample_process(&self) {
        let Some(process) = ProcessSample::read() else {
            return;
        };
        // The counter moves by what the process used since the last scrape.
        let used = process.cpu_seconds - self.cpu_seconds.get();
        if used > 0.0 {
            self.cpu_seconds.inc_by(used);
        }
        self.set(
            "process_resident_memory_bytes",
            Vec::new(),
            process.resident_bytes,
        );
        self.set("process_open_fds", Vec::new(), process.open_fds);
        self.set(
            "process_start_time_seconds",
            Vec::new(),
            process.start_time_seconds,
        );
    }
}

/// The process's own figures, from `/proc/self`.
struct ProcessSample {
    cpu_seconds: f64,
    resident_bytes: i64,
    open_fds: i64,
    start_time_seconds: i64,
}

impl ProcessSample {
    fn read() -> Option<Self> {
        // Clock ticks and pages as Linux counts them (100 Hz, 4 KiB).
        const TICKS: i64 = 100;
        const PAGE: i64 = 4096;
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let fields: Vec<i64> = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .map(|field| field.parse().unwrap_or(0))
            .collect();
        let cpu = fields.get(11)? + fields.get(12)?;
        let started_ticks = *fields.get(19)?;
        let resident_pages = *fields.get(21)?;
        let boot_time: i64 = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|line| line.strip_prefix("btime ")?.trim().parse().ok())?;
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count();
        Some(ProcessSample {
            cpu_seconds: cpu as f64 / TICKS as f64,
            resident_bytes: resident_pages * PAGE,
            open_fds: i64::try_from(open_fds).unwrap_or(i64::MAX),
            start_time_seconds: boot_time + started_ticks / TICKS,
        })
    }
}

impl Metrics for MetricsRegistry {
    fn add(&self, name: &'static str, labels: Labels, amount: u64) {
        if let Some(family) = self.counters.get(name) {
            family.get_or_create(&self.bounded(&labels)).inc_by(amount);
        }
    }

    fn observe(&self, name: &'static str, labels: Labels, value: f64) {
        if let Some(family) = self.histograms.get(name) {
            family.get_or_create(&self.bounded(&labels)).observe(value);
        }
    }

    fn render(&self) -> BoxFuture<'_, String> {
        Box::pin(async move {
            let samplers: Vec<Arc<dyn Sampler>> = self
                .samplers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            for sampler in samplers {
                for (name, labels, value) in sampler.sample().await {
                    self.set(name, labels, value);
                }
            }
            self.sample_process();
            let mut out = String::new();
            // Writing to a String cannot fail.
            let _ = encode(&mut out, &self.registry);
            out
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Thousands of names from outside (scripts' unknown tools, tenants'
    /// servers and their tools) add a bounded number of series: the
    /// operator's names and the fold values, never one per name.
    #[tokio::test]
    async fn series_are_bounded_whatever_names_arrive() {
        let metrics = MetricsRegistry::new("0.1.0", "abc").with_bounds(LabelBounds {
            named_servers: ["reads".to_owned()].into(),
        });
        let count = |name: &str, source: &str| {
            metrics.increment(
                "tool_calls_total",
                vec![
                    ("name", name.to_owned()),
                    ("source", source.to_owned()),
                    ("outcome_status", "failed".to_owned()),
                ],
            );
        };
        for index in 0..5_000 {
            count(&format!("mcp.tenant{index}.tool{index}"), "mcp");
            count(&format!("mcp.reads.tool{index}"), "mcp");
            metrics.increment(
                "mcp_connect_failures_total",
                vec![
                    ("server", format!("tenant-server-{index}")),
                    ("reason_code", "tool.server_unreachable".to_owned()),
                ],
            );
        }
        count("demo.echo", "builtin");
        let text = metrics.render().await;
        let series = |family: &str| text.lines().filter(|line| line.starts_with(family)).count();
        // The operator's server's tools up to the bound, the rest folded
        // into one series; tenants' tools into one; the builtin its own.
        assert_eq!(series("toolgate_tool_calls_total{"), MAXIMUM_TOOL_NAMES + 3);
        assert!(text.contains(&format!("name=\"{TENANT_SERVER_TOOLS}\"")));
        assert!(text.contains(&format!("name=\"{OTHER_TOOLS}\"")));
        assert_eq!(series("toolgate_mcp_connect_failures_total{"), 1);
        assert!(text.contains(&format!("server=\"{TENANT_SERVERS}\"")));
    }

    #[tokio::test]
    async fn series_render_as_openmetrics_with_the_prefix() {
        let metrics = MetricsRegistry::new("0.1.0", "abc123");
        let labels = vec![
            ("name", "demo.echo".to_owned()),
            ("source", "builtin".to_owned()),
        ];
        metrics.increment("tool_truncations_total", labels.clone());
        metrics.increment("tool_truncations_total", labels.clone());
        metrics.observe("tool_duration_seconds", labels.clone(), 0.02);
        metrics.set("turns_open", Vec::new(), 3);
        // Some CPU to count: more than a clock tick.
        let mut spun = 0u64;
        for step in 0..20_000_000u64 {
            spun = std::hint::black_box(spun.wrapping_add(step));
        }
        let text = metrics.render().await;
        for expected in [
            "# TYPE toolgate_tool_truncations counter",
            "toolgate_tool_truncations_total{name=\"demo.echo\",source=\"builtin\"} 2",
            "toolgate_tool_duration_seconds_bucket{le=\"0.01\",name=\"demo.echo\",source=\"builtin\"} 0",
            "toolgate_tool_duration_seconds_count{name=\"demo.echo\",source=\"builtin\"} 1",
            "toolgate_turns_open 3",
            "toolgate_build_info{version=\"0.1.0\",revision=\"abc123\"} 1",
            "toolgate_process_resident_memory_bytes ",
            "# TYPE toolgate_process_cpu_seconds counter",
            "toolgate_process_cpu_seconds_total ",
            "# EOF",
        ] {
            assert!(text.contains(expected), "{expected} missing:\n{text}");
        }
        // In seconds with their fraction, not whole seconds.
        let cpu = text
            .lines()
            .find_map(|line| line.strip_prefix("toolgate_process_cpu_seconds_total "))
            .unwrap();
        assert!(
            cpu.contains('.') && cpu.parse::<f64>().unwrap() > 0.0,
            "{cpu}"
        );
        assert_eq!(metrics.counter("tool_truncations_total", &labels), 2);
    }
}
