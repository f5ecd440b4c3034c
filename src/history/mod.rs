//! History that outlives clusters (issue 33). Today: `raypipe collector`, a sidecar that speaks
//! KubeRay v1.7's collector protocol (Ray's events on `POST /v1/events`, session logs from
//! `/tmp/ray`) and writes KubeRay's bucket layout through one object-store interface, so
//! KubeRay's history server can read it; and `raypipe history`, which reads such a bucket back.

pub mod collector;
pub mod event;
pub mod layout;
pub mod read;
pub mod sink;
pub mod spool;
pub mod store;
