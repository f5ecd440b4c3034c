//! raypipe: a Kubernetes operator for model-serving pipelines on Ray.
//!
//! The data flow is ServePipeline → source (fetch) → graph (decode, validate) → serve (render)
//! → RayService → RayCluster → Pods; see DESIGN.md in the repository.

pub mod admin;
pub mod api;
pub mod cli;
pub mod config;
pub mod console;
pub mod controllers;
/// The local development environment (`raypipe dev`, tests, benchmarks): left out of the
/// released operator, which builds without the `dev` feature.
#[cfg(feature = "dev")]
pub mod devenv;
pub mod graph;
pub mod history;
pub mod k8s;
pub mod kuberay;
pub mod leader;
pub mod present;
pub mod pypackage;
pub mod ray;
pub mod serve;
pub mod source;
pub mod startup;
pub mod tls;
pub mod validation;
pub mod webhook;
