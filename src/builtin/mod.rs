//! Builtin tools. They see ports and domain only: never the registry, the
//! executor or an adapter, so a builtin cannot call another tool.

pub mod control;
pub mod demo;

use std::path::Path;
use std::sync::Arc;

use crate::ports::{Clock, EventStore, McpServers, Tool};

/// The build's tool set: the demo tools writing under `demo_directory` and
/// the five control tools (`skill.load` served by `skills`, its notes
/// recorded in `events`).
pub fn tools(
    demo_directory: &Path,
    skills: Arc<dyn McpServers>,
    events: Arc<dyn EventStore>,
    clock: Arc<dyn Clock>,
) -> Vec<Arc<dyn Tool>> {
    let mut tools = demo::tools(demo_directory);
    tools.extend(control::tools(skills, events, clock));
    tools
}
