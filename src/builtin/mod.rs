//! Builtin tools. They see ports and domain only: never the registry, the
//! executor or an adapter, so a builtin cannot call another tool.

pub mod control;
pub mod demo;
pub mod skills;

use std::path::Path;
use std::sync::Arc;

use crate::ports::{Clock, EventStore, McpServers, SkillStore, Tool};

/// The build's tool set: the demo tools writing under `demo_directory`,
/// the five control tools (`skill.load` serving the servers' prompts from
/// `servers` and the tenant's own skills from `authored`, its notes recorded
/// in `events`), and `skill.manage` writing to `authored`.
pub fn tools(
    demo_directory: &Path,
    servers: Arc<dyn McpServers>,
    authored: Arc<dyn SkillStore>,
    events: Arc<dyn EventStore>,
    clock: Arc<dyn Clock>,
) -> Vec<Arc<dyn Tool>> {
    let mut tools = demo::tools(demo_directory);
    tools.extend(control::tools(
        servers,
        authored.clone(),
        events,
        clock.clone(),
    ));
    tools.push(skills::tool(authored, clock));
    tools
}
