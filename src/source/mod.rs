//! Fetching a model graph: HTTPS, bearer token, digest, ETag, limits, retries.
