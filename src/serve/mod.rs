//! The typed Ray Serve config and its rendering from a validated graph.
