//! Adapters: each implements ports with its own library and knows no other
//! adapter.

pub mod artifacts;
pub mod credentials;
pub mod egress;
pub mod mcp;
pub mod policy;
pub mod store;
pub mod telemetry;
