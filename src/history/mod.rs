//! History that outlives clusters (issue 33), all through one object-store interface:
//! `raypipe collector`, a sidecar that speaks KubeRay v1.7's collector protocol (Ray's events on
//! `POST /v1/events`, session logs from `/tmp/ray`) and writes KubeRay's bucket layout, so
//! KubeRay's history server can read it; the recorder, which writes each ServePipeline
//! revision's record from the pipelines' status (`revisions`, `recorder`); and the readers:
//! `raypipe history` and its HTTP API (`api`, Kubernetes TokenReview and SubjectAccessReview).

pub mod api;
pub mod collector;
pub mod event;
pub mod layout;
pub mod read;
pub mod recorder;
pub mod revisions;
pub mod sink;
pub mod spool;
pub mod store;
