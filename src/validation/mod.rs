//! Pure validation shared by the controllers, the webhook and the CLI: no client, no I/O.
//! Everything here reads untrusted input (custom resources, annotations, flags) and answers
//! with a value or a named error, never a panic.

pub mod cron;
pub mod duration;
pub mod feature_gates;
pub mod k8s_names;
pub mod pod;
pub mod problem;
pub mod raycluster;
pub mod raycronjob;
pub mod rayjob;
pub mod rayservice;
pub mod servepipeline;
pub mod validated;

pub use duration::{DurationError, parse_bounded, parse_duration, parse_go_duration};

#[cfg(test)]
mod tests;
