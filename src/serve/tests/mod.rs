//! Tests of the serve module: rendering itself, and the tests that follow a graph from the
//! graph module all the way to a rendered config (samples, random graphs, the fuzz harness),
//! which sit here because `graph` never imports `serve`.

mod fuse;
mod fuzz;
mod properties;
mod render;
mod samples;
mod shared;
mod starts;
