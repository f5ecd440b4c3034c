//! The shared Ray vocabulary: the label and annotation keys, ports, object names and spec
//! predicates that every Ray controller, the dashboard locator, the validators and the webhook
//! must agree on byte for byte with KubeRay. It sits below all of them; `controllers/raycluster`
//! keeps only what the RayCluster controller itself builds.

pub mod keys;
pub mod kueue;
pub mod names;
pub mod quantity;
pub mod spec;
