//! raypipe's integration tests: one binary, one module per area. Tests that need Kubernetes
//! share one real kube-apiserver + etcd per run (see `support`).

mod source;
