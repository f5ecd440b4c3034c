//! Tests of the graph module that span several of its files.

mod fuzz;
mod hardening;
mod properties;
mod samples;
mod text;
mod validation;
mod vectors;
