//! toolgate: the tool gateway beside agent sandboxes.
//!
//! Layout and boundaries are ARCHITECTURE.md §3's; the import-graph test in
//! `tests/it/boundaries.rs` keeps them honest.

// One function may use it, saying why: the capability drop in a stdio
// server's child between fork and exec (adapters::mcp::child).
#![deny(unsafe_code)]

pub mod adapters;
pub mod api;
pub mod app;
pub mod bridge;
pub mod builtin;
pub mod config;
pub mod console;
pub mod domain;
pub mod edge;
pub mod front;
pub mod pipeline;
pub mod ports;
