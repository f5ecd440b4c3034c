//! How a pipeline looks to a person (pure): the summary `kubectl raypipe get` prints and the
//! console lists, the rollout's words, and the graph as it runs on the RayService. Shared by
//! the plugin (`cli`) and the console, which may not import each other.

pub mod running;
pub mod summary;
