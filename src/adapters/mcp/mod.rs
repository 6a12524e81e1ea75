//! MCP: the only module that names rmcp, as a client of servers (`client`
//! and `http`) and as the front door's server side (`front`).
//! `child` starts and ends a stdio server's process (a built environment,
//! its own process group, a drained stderr); `http` carries streamable HTTP
//! through the egress dialer, with `auth` writing the credential at use;
//! `catalog` maps a server's declarations into `ToolSpec`s; `server` keeps
//! one server's pin, connection and 401 ladder and serves the `Tool`s the
//! pipeline calls; `servers` is every server of a runtime, the operator's
//! and each tenant's own.

pub mod auth;
pub mod catalog;
pub mod child;
pub mod client;
pub mod consent;
pub mod framing;
pub mod front;
pub mod grant;
pub mod http;
mod render;
pub mod server;
pub mod servers;
mod slots;

pub use auth::AuthSettings;
pub use consent::{ConsentSettings, Delegations, StoredGrants};
pub use server::{HttpServerSettings, StdioServerSettings};
pub use servers::{McpServerSet, WarmUp};
