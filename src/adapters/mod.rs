//! Adapters: each implements ports with its own library and knows no other
//! adapter.

pub mod store;
