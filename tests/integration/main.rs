//! raypipe's integration tests: one binary, one module per area. Tests that need Kubernetes
//! share one real control plane per run (see `support`).

mod admin;
mod alerts;
mod code;
mod crds;
mod dag_oci;
mod deploy;
mod dev;
mod fair_fetches;
mod faults;
mod gitops_health;
mod graph_diff;
mod hardening;
mod history;
mod history_api;
mod leader;
mod oci_interop;
mod pipeline;
mod ray;
mod raycluster;
mod raycronjob;
mod rayjob;
mod rayservice;
mod rayservice_incremental;
mod rayservice_samples;
mod release;
mod rollout;
mod runtime;
mod s3_code;
mod samples;
mod servepipeline;
mod source;
mod support;
mod user_roles;
mod webhook;
