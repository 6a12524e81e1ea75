//! The composition root: the only place that wires adapters to ports.
//!
//! Reads nothing from the process on its own; `main` hands it the
//! configuration path and the environment.

use std::collections::BTreeMap;
use std::path::Path;

use crate::config::{Config, ConfigErrors};

/// What `toolgate check-config` reports about a valid file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigSummary {
    /// `sqlite` or `postgres`.
    pub store_backend: &'static str,
    /// Operator stdio servers configured (enabled or not).
    pub stdio_servers: usize,
    /// Egress allowlist entries.
    pub egress_entries: usize,
}

/// Loads and validates the configuration at `path` as `serve` would.
pub fn check_config(
    path: &Path,
    environment: &BTreeMap<String, String>,
) -> Result<ConfigSummary, ConfigErrors> {
    let config = Config::load(path, environment)?;
    Ok(ConfigSummary {
        store_backend: if config.store.url.starts_with("sqlite:") {
            "sqlite"
        } else {
            "postgres"
        },
        stdio_servers: config.mcp.servers.len(),
        egress_entries: config.egress.allow.len(),
    })
}
