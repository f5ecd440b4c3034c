//! Tests of the graph module that span several of its files.

mod hardening;
pub(crate) mod properties;
pub(crate) mod samples;
mod text;
mod validation;
mod vectors;
pub(crate) mod wire_bytes;
