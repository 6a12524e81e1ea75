//! Builtin tools. They see ports and domain only: never the registry, the
//! executor or an adapter, so a builtin cannot call another tool.

pub mod control;
pub mod demo;
