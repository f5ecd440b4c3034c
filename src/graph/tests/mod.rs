//! Tests of the graph module that span several of its files.

mod properties;
mod samples;
mod text;
mod validation;
mod vectors;
