//! The composition root: the only place that wires adapters to ports.
//!
//! Reads nothing from the process on its own; `main` hands it the
//! configuration path and the environment.

use std::collections::BTreeMap;
use std::path::Path;

use crate::adapters::store;
use crate::config::{Config, ConfigErrors};
use crate::ports::StoreError;

/// Why a command could not run.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The configuration is invalid.
    #[error("{0}")]
    Config(#[from] ConfigErrors),
    /// The store failed.
    #[error("{0}")]
    Store(#[from] StoreError),
}

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

/// `toolgate migrate`: applies the store's pending migrations and returns
/// the versions applied (empty when already current).
pub async fn migrate(
    path: &Path,
    environment: &BTreeMap<String, String>,
) -> Result<Vec<i64>, AppError> {
    let config = Config::load(path, environment)?;
    let store = store::connect(&config.store.url).await?;
    Ok(store.migrate().await?)
}
