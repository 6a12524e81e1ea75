//! MCP servers: the only module that will name rmcp. For now it owns how an
//! operator-configured stdio server's process is started and ended (a built
//! environment, its own process group, a drained stderr) and how a server's
//! tool declarations become `ToolSpec`s.

pub mod catalog;
pub mod child;
pub mod client;
pub mod stdio;
