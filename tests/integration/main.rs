//! raypipe's integration tests: one binary, one module per area. Tests that need Kubernetes
//! share one real control plane per run (see `support`).

mod crds;
mod dev;
mod servepipeline;
mod source;
mod support;
