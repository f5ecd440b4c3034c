//! A real kube-apiserver + etcd on 127.0.0.1 for tests and `raypipe dev`.
