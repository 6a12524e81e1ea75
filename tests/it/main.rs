//! The one integration-test binary: every extra binary costs link time.

// These time and pace real processes from outside them: the system's clock
// is the one they share (clippy.toml keeps it out of `src`).
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

mod app;
mod boundaries;
mod clients;
mod config;
mod conformance;
mod consent;
mod console;
mod crash;
mod deploy;
mod front;
mod front_clients;
mod fuzz;
mod gates;
mod http;
mod mcp;
mod nodes;
mod operations;
mod operator;
mod pipeline;
mod readme;
mod recovery;
mod security;
mod serve;
mod signals;
mod store;
mod support;
mod tenants;
mod torture;
mod transitions;
mod wire;
