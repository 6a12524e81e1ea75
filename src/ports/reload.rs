//! Reloading a running node: what the control API's `POST /v1/reload`
//! and SIGHUP ask of the composition root, and what it answers.

use serde::Serialize;

use super::tool::BoxFuture;

/// What one reload did. Each entry is a section or a file of the
/// configuration, named as the file names it, with what happened to it;
/// never a value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReloadReport {
    /// Read again and now in force, with what changed.
    pub reloaded: Vec<String>,
    /// Read again and found as they were.
    pub unchanged: Vec<String>,
    /// Changed in the file, in force only from the node's next start.
    pub restart_required: Vec<String>,
    /// Did not validate: what was in force stays.
    pub refused: Vec<String>,
}

/// Reloads the running node from its configuration.
pub trait Reload: Send + Sync {
    /// Reads the configuration and the files it names again, puts in force
    /// what may change while the node runs, and reports every section.
    fn reload(&self) -> BoxFuture<'_, ReloadReport>;
}
