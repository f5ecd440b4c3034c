//! Source fetching against a real HTTP(S) server on 127.0.0.1.
