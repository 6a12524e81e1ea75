//! MCP servers: the only module that names rmcp (in `client`). `child`
//! starts and ends a stdio server's process (a built environment, its own
//! process group, a drained stderr); `catalog` maps a server's declarations
//! into `ToolSpec`s; `stdio` remembers discoveries, owns the connections and
//! serves the `Tool`s the pipeline calls.

pub mod catalog;
pub mod child;
pub mod client;
pub mod framing;
pub mod stdio;
