//! The OCI side of the dev/test registry ([`super::registry`]): enough of the OCI distribution
//! API for `raypipe dag push`/`pull`, `source.oci`, oras or crane — blobs (HEAD/GET, monolithic
//! and chunked uploads: POST, PATCH, PUT with `digest`), manifests by tag or digest (PUT,
//! HEAD, GET, with `Docker-Content-Digest`) and `tags/list` — kept in memory.
//!
//! Embedded rather than the distribution binary: `raypipe dev` needs only Ray on a fresh
//! machine, and this starts in microseconds with the plain-URL registry on the same port.
//! Deliberate limits: blobs are shared by all repositories (content-addressed), no deletes, no
//! referrers API (clients fall back to the tag convention), a manifest must name blobs the
//! registry has, and everything together is capped at [`MAX_STORED_BYTES`].

use std::collections::{BTreeMap, HashMap};

use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use sha2::{Digest, Sha256};

/// All blobs, manifests and unfinished uploads together.
pub const MAX_STORED_BYTES: usize = 512 << 20;
/// Uploads started and not finished, kept at once.
const MAX_OPEN_UPLOADS: usize = 64;

const DOCKER_CONTENT_DIGEST: &str = "docker-content-digest";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// What the registry stores.
#[derive(Default)]
pub struct OciStore {
    blobs: HashMap<String, Bytes>,
    /// (repository, digest) → (media type, bytes).
    manifests: HashMap<(String, String), (String, Bytes)>,
    /// repository → tag → manifest digest.
    tags: HashMap<String, BTreeMap<String, String>>,
    /// upload id → (repository, bytes so far).
    uploads: HashMap<String, (String, BytesMut)>,
    stored_bytes: usize,
    next_upload: u64,
}

fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A distribution-spec error answer.
fn error(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({"errors": [{"code": code, "message": message}]}).to_string(),
    )
        .into_response()
}

/// The 401 for an OCI path: Basic, with the dev token as the password (any user name).
pub fn unauthorized() -> Response {
    let mut response = error(
        StatusCode::UNAUTHORIZED,
        "UNAUTHORIZED",
        "authentication required: any user name, the registry token as password",
    );
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"raypipe-dev\""),
    );
    response
}

/// Whether `path` (without its leading `/`) is an OCI distribution API path.
pub fn is_oci_path(path: &str) -> bool {
    path == "v2" || path.starts_with("v2/")
}

/// What an OCI path asks for.
#[derive(Debug, PartialEq, Eq)]
enum Route<'a> {
    Base,
    Blob {
        repository: &'a str,
        digest: &'a str,
    },
    Uploads {
        repository: &'a str,
        id: Option<&'a str>,
    },
    Manifest {
        repository: &'a str,
        reference: &'a str,
    },
    Tags {
        repository: &'a str,
    },
}

fn route(path: &str) -> Option<Route<'_>> {
    let rest = path.strip_prefix("v2")?;
    let rest = rest.strip_prefix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Some(Route::Base);
    }
    if let Some(repository) = rest.strip_suffix("/tags/list") {
        return Some(Route::Tags { repository });
    }
    if let Some((repository, id)) = rest.rsplit_once("/blobs/uploads") {
        let id = id.trim_start_matches('/');
        return Some(Route::Uploads {
            repository,
            id: (!id.is_empty()).then_some(id),
        });
    }
    if let Some((repository, digest)) = rest.rsplit_once("/blobs/") {
        return Some(Route::Blob { repository, digest });
    }
    if let Some((repository, reference)) = rest.rsplit_once("/manifests/") {
        return Some(Route::Manifest {
            repository,
            reference,
        });
    }
    None
}

/// The value of `name` in a query string.
fn query_value<'q>(query: Option<&'q str>, name: &str) -> Option<&'q str> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// `sha256:<hex>` as it appears in a query (`:` may be percent-encoded).
fn query_digest(query: Option<&str>) -> Option<String> {
    query_value(query, "digest").map(|d| d.replace("%3A", ":").replace("%3a", ":"))
}

fn with_digest(mut response: Response, digest: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(digest) {
        response.headers_mut().insert(DOCKER_CONTENT_DIGEST, value);
    }
    response
}

fn created(location: String, digest: &str) -> Response {
    with_digest(
        (StatusCode::CREATED, [(header::LOCATION, location)]).into_response(),
        digest,
    )
}

impl OciStore {
    fn room_for(&self, bytes: usize) -> bool {
        self.stored_bytes.saturating_add(bytes) <= MAX_STORED_BYTES
    }

    fn store_blob(&mut self, digest: String, bytes: Bytes) {
        if !self.blobs.contains_key(&digest) {
            self.stored_bytes = self.stored_bytes.saturating_add(bytes.len());
            self.blobs.insert(digest, bytes);
        }
    }

    /// Stores a graph artifact under `repository:tag` directly (what `raypipe dag push` would
    /// upload): how `raypipe dev` seeds its sample graphs.
    pub fn put_artifact(
        &mut self,
        repository: &str,
        tag: &str,
        artifact: &crate::source::oci::push::GraphArtifact,
    ) {
        self.store_blob(
            sha256_digest(crate::source::oci::manifest::EMPTY_CONFIG),
            Bytes::from_static(crate::source::oci::manifest::EMPTY_CONFIG),
        );
        self.store_blob(artifact.graph_digest.to_string(), artifact.graph.clone());
        if let Some((bytes, digest)) = &artifact.code {
            self.store_blob(digest.to_string(), bytes.clone());
        }
        let digest = artifact.manifest_digest.to_string();
        self.stored_bytes = self.stored_bytes.saturating_add(artifact.manifest.len());
        self.manifests.insert(
            (repository.to_owned(), digest.clone()),
            (OCI_MANIFEST.to_owned(), artifact.manifest.clone()),
        );
        self.tags
            .entry(repository.to_owned())
            .or_default()
            .insert(tag.to_owned(), digest);
    }

    /// Answers one OCI request.
    pub fn handle(
        &mut self,
        method: &Method,
        path: &str,
        query: Option<&str>,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Response {
        let Some(route) = route(path) else {
            return error(StatusCode::NOT_FOUND, "NAME_UNKNOWN", "no such API path");
        };
        match (method.as_str(), route) {
            ("GET" | "HEAD", Route::Base) => {
                ([(header::CONTENT_TYPE, "application/json")], "{}").into_response()
            }
            ("GET" | "HEAD", Route::Blob { digest, .. }) => match self.blobs.get(digest) {
                Some(bytes) => with_digest(
                    (
                        [(header::CONTENT_TYPE, "application/octet-stream")],
                        if method == Method::HEAD {
                            Bytes::new()
                        } else {
                            bytes.clone()
                        },
                    )
                        .into_response(),
                    digest,
                )
                .with_length(bytes.len()),
                None => error(StatusCode::NOT_FOUND, "BLOB_UNKNOWN", "no such blob"),
            },
            (
                "POST",
                Route::Uploads {
                    repository,
                    id: None,
                },
            ) => self.start_upload(repository, query, body),
            (
                "PATCH",
                Route::Uploads {
                    repository,
                    id: Some(id),
                },
            ) => self.append(repository, id, body),
            (
                "PUT",
                Route::Uploads {
                    repository,
                    id: Some(id),
                },
            ) => self.finish_upload(repository, id, query, body),
            (
                "PUT",
                Route::Manifest {
                    repository,
                    reference,
                },
            ) => self.put_manifest(repository, reference, headers, body),
            (
                "GET" | "HEAD",
                Route::Manifest {
                    repository,
                    reference,
                },
            ) => self.get_manifest(method, repository, reference),
            ("GET", Route::Tags { repository }) => {
                let tags: Vec<&String> = self
                    .tags
                    .get(repository)
                    .map(|tags| tags.keys().collect())
                    .unwrap_or_default();
                if tags.is_empty() {
                    return error(StatusCode::NOT_FOUND, "NAME_UNKNOWN", "no such repository");
                }
                (
                    [(header::CONTENT_TYPE, "application/json")],
                    serde_json::json!({"name": repository, "tags": tags}).to_string(),
                )
                    .into_response()
            }
            _ => error(
                StatusCode::METHOD_NOT_ALLOWED,
                "UNSUPPORTED",
                "the dev registry does not support this request",
            ),
        }
    }

    fn start_upload(&mut self, repository: &str, query: Option<&str>, body: Bytes) -> Response {
        // A single POST with the digest and the bytes is a whole upload.
        if let Some(digest) = query_digest(query) {
            return self.complete(repository, &digest, body);
        }
        if self.uploads.len() >= MAX_OPEN_UPLOADS {
            return error(
                StatusCode::TOO_MANY_REQUESTS,
                "TOOMANYREQUESTS",
                "too many unfinished uploads",
            );
        }
        self.next_upload += 1;
        let id = format!("upload-{}", self.next_upload);
        self.uploads
            .insert(id.clone(), (repository.to_owned(), BytesMut::new()));
        (
            StatusCode::ACCEPTED,
            [
                (
                    header::LOCATION,
                    format!("/v2/{repository}/blobs/uploads/{id}"),
                ),
                (header::RANGE, "0-0".to_owned()),
                (
                    header::HeaderName::from_static("docker-upload-uuid"),
                    id.clone(),
                ),
            ],
        )
            .into_response()
    }

    fn append(&mut self, repository: &str, id: &str, body: Bytes) -> Response {
        if !self.room_for(body.len()) {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "SIZE_INVALID",
                "the dev registry is full",
            );
        }
        let Some((owner, bytes)) = self.uploads.get_mut(id) else {
            return error(
                StatusCode::NOT_FOUND,
                "BLOB_UPLOAD_UNKNOWN",
                "no such upload",
            );
        };
        if owner != repository {
            return error(
                StatusCode::NOT_FOUND,
                "BLOB_UPLOAD_UNKNOWN",
                "no such upload",
            );
        }
        bytes.extend_from_slice(&body);
        self.stored_bytes = self.stored_bytes.saturating_add(body.len());
        let end = bytes.len().saturating_sub(1);
        (
            StatusCode::ACCEPTED,
            [
                (
                    header::LOCATION,
                    format!("/v2/{repository}/blobs/uploads/{id}"),
                ),
                (header::RANGE, format!("0-{end}")),
            ],
        )
            .into_response()
    }

    fn finish_upload(
        &mut self,
        repository: &str,
        id: &str,
        query: Option<&str>,
        body: Bytes,
    ) -> Response {
        let Some(digest) = query_digest(query) else {
            return error(
                StatusCode::BAD_REQUEST,
                "DIGEST_INVALID",
                "digest parameter missing",
            );
        };
        match self.uploads.get(id) {
            Some((owner, _)) if owner == repository => {}
            _ => {
                return error(
                    StatusCode::NOT_FOUND,
                    "BLOB_UPLOAD_UNKNOWN",
                    "no such upload",
                );
            }
        }
        let Some((_, mut bytes)) = self.uploads.remove(id) else {
            return error(
                StatusCode::NOT_FOUND,
                "BLOB_UPLOAD_UNKNOWN",
                "no such upload",
            );
        };
        self.stored_bytes = self.stored_bytes.saturating_sub(bytes.len());
        bytes.extend_from_slice(&body);
        self.complete(repository, &digest, bytes.freeze())
    }

    /// Stores `bytes` as blob `digest` after checking it.
    fn complete(&mut self, repository: &str, digest: &str, bytes: Bytes) -> Response {
        if sha256_digest(&bytes) != digest {
            return error(
                StatusCode::BAD_REQUEST,
                "DIGEST_INVALID",
                "the content does not match the digest",
            );
        }
        if !self.room_for(bytes.len()) {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "SIZE_INVALID",
                "the dev registry is full",
            );
        }
        self.store_blob(digest.to_owned(), bytes);
        created(format!("/v2/{repository}/blobs/{digest}"), digest)
    }

    fn put_manifest(
        &mut self,
        repository: &str,
        reference: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Response {
        #[derive(serde::Deserialize)]
        struct Referenced {
            digest: String,
        }
        #[derive(serde::Deserialize)]
        struct Manifest {
            #[serde(rename = "mediaType")]
            media_type: Option<String>,
            config: Option<Referenced>,
            #[serde(default)]
            layers: Vec<Referenced>,
        }
        let Ok(manifest) = serde_json::from_slice::<Manifest>(&body) else {
            return error(
                StatusCode::BAD_REQUEST,
                "MANIFEST_INVALID",
                "not a manifest",
            );
        };
        let missing = manifest
            .config
            .iter()
            .chain(&manifest.layers)
            .any(|blob| !self.blobs.contains_key(&blob.digest));
        if missing {
            return error(
                StatusCode::BAD_REQUEST,
                "MANIFEST_BLOB_UNKNOWN",
                "the manifest names a blob the registry does not have",
            );
        }
        let digest = sha256_digest(&body);
        if reference.starts_with("sha256:") && reference != digest {
            return error(
                StatusCode::BAD_REQUEST,
                "DIGEST_INVALID",
                "the manifest does not match the digest",
            );
        }
        if !self.room_for(body.len()) {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "SIZE_INVALID",
                "the dev registry is full",
            );
        }
        let media_type = headers
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
            .or(manifest.media_type)
            .unwrap_or_else(|| OCI_MANIFEST.to_owned());
        self.stored_bytes = self.stored_bytes.saturating_add(body.len());
        self.manifests
            .insert((repository.to_owned(), digest.clone()), (media_type, body));
        if !reference.starts_with("sha256:") {
            self.tags
                .entry(repository.to_owned())
                .or_default()
                .insert(reference.to_owned(), digest.clone());
        }
        created(format!("/v2/{repository}/manifests/{digest}"), &digest)
    }

    fn get_manifest(&self, method: &Method, repository: &str, reference: &str) -> Response {
        let digest = if reference.starts_with("sha256:") {
            Some(reference.to_owned())
        } else {
            self.tags
                .get(repository)
                .and_then(|tags| tags.get(reference))
                .cloned()
        };
        let found = digest.and_then(|digest| {
            self.manifests
                .get(&(repository.to_owned(), digest.clone()))
                .map(|stored| (digest, stored))
        });
        let Some((digest, (media_type, bytes))) = found else {
            return error(
                StatusCode::NOT_FOUND,
                "MANIFEST_UNKNOWN",
                "no such manifest",
            );
        };
        let body = if method == Method::HEAD {
            Bytes::new()
        } else {
            bytes.clone()
        };
        with_digest(
            ([(header::CONTENT_TYPE, media_type.clone())], body).into_response(),
            &digest,
        )
        .with_length(bytes.len())
    }
}

/// Sets Content-Length (a HEAD answer declares the length of what GET would send).
trait WithLength {
    fn with_length(self, length: usize) -> Self;
}

impl WithLength for Response {
    fn with_length(mut self, length: usize) -> Self {
        self.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(length));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(store: &mut OciStore, method: Method, path_and_query: &str, body: &[u8]) -> Response {
        let (path, query) = match path_and_query.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (path_and_query, None),
        };
        store.handle(
            &method,
            path.trim_start_matches('/'),
            query,
            &HeaderMap::new(),
            Bytes::copy_from_slice(body),
        )
    }

    fn header_of(response: &Response, name: &str) -> String {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    }

    #[test]
    fn paths_name_repositories_with_slashes() {
        assert_eq!(route("v2/"), Some(Route::Base));
        assert_eq!(
            route("v2/team/g/manifests/v1"),
            Some(Route::Manifest {
                repository: "team/g",
                reference: "v1"
            })
        );
        assert_eq!(
            route("v2/a/b/c/blobs/uploads/"),
            Some(Route::Uploads {
                repository: "a/b/c",
                id: None
            })
        );
        assert_eq!(
            route("v2/a/blobs/sha256:00"),
            Some(Route::Blob {
                repository: "a",
                digest: "sha256:00"
            })
        );
        assert_eq!(
            route("v2/a/tags/list"),
            Some(Route::Tags { repository: "a" })
        );
        assert!(!is_oci_path("graphs/v2/x.pb") && is_oci_path("v2/"));
    }

    #[test]
    fn a_chunked_upload_then_a_manifest_by_tag_reads_back_by_tag_and_digest() {
        let mut store = OciStore::default();
        let blob = b"graph bytes";
        let digest = sha256_digest(blob);
        let started = send(&mut store, Method::POST, "/v2/team/g/blobs/uploads/", b"");
        assert_eq!(started.status(), StatusCode::ACCEPTED);
        let location = header_of(&started, "location");
        let patched = send(&mut store, Method::PATCH, &location, &blob[..5]);
        assert_eq!(patched.status(), StatusCode::ACCEPTED);
        assert_eq!(header_of(&patched, "range"), "0-4");
        let wrong = send(
            &mut store,
            Method::PUT,
            &format!("{location}?digest={}", sha256_digest(b"other")),
            &blob[5..],
        );
        assert_eq!(
            wrong.status(),
            StatusCode::BAD_REQUEST,
            "a wrong digest is refused"
        );

        // Again, properly; the config blob as a single POST.
        let location = header_of(
            &send(&mut store, Method::POST, "/v2/team/g/blobs/uploads/", b""),
            "location",
        );
        send(&mut store, Method::PATCH, &location, &blob[..5]);
        let done = send(
            &mut store,
            Method::PUT,
            &format!("{location}?digest={}", digest.replace(':', "%3A")),
            &blob[5..],
        );
        assert_eq!(done.status(), StatusCode::CREATED);
        assert_eq!(header_of(&done, DOCKER_CONTENT_DIGEST), digest);
        let config_digest = sha256_digest(b"{}");
        let single = send(
            &mut store,
            Method::POST,
            &format!("/v2/team/g/blobs/uploads/?digest={config_digest}"),
            b"{}",
        );
        assert_eq!(single.status(), StatusCode::CREATED);
        assert_eq!(
            send(
                &mut store,
                Method::HEAD,
                &format!("/v2/team/g/blobs/{digest}"),
                b""
            )
            .status(),
            StatusCode::OK
        );

        let manifest = serde_json::json!({
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": config_digest, "size": 2},
            "layers": [{"mediaType": "application/vnd.raypipe.graph.v1+protobuf", "digest": digest, "size": blob.len()}],
        })
        .to_string();
        let put = send(
            &mut store,
            Method::PUT,
            "/v2/team/g/manifests/v1",
            manifest.as_bytes(),
        );
        assert_eq!(put.status(), StatusCode::CREATED);
        let manifest_digest = sha256_digest(manifest.as_bytes());
        assert_eq!(header_of(&put, DOCKER_CONTENT_DIGEST), manifest_digest);
        let head = send(&mut store, Method::HEAD, "/v2/team/g/manifests/v1", b"");
        assert_eq!(head.status(), StatusCode::OK);
        assert_eq!(header_of(&head, DOCKER_CONTENT_DIGEST), manifest_digest);
        assert_eq!(
            header_of(&head, "content-length"),
            manifest.len().to_string()
        );
        let by_digest = send(
            &mut store,
            Method::GET,
            &format!("/v2/team/g/manifests/{manifest_digest}"),
            b"",
        );
        assert_eq!(by_digest.status(), StatusCode::OK);
        assert_eq!(header_of(&by_digest, "content-type"), OCI_MANIFEST);
        assert_eq!(
            send(&mut store, Method::GET, "/v2/team/g/manifests/v2", b"").status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            send(&mut store, Method::GET, "/v2/other/manifests/v1", b"").status(),
            StatusCode::NOT_FOUND,
            "manifests belong to their repository"
        );
    }

    #[test]
    fn a_manifest_naming_missing_blobs_is_refused() {
        let mut store = OciStore::default();
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "config": {"mediaType": "x", "digest": sha256_digest(b"{}"), "size": 2},
            "layers": [],
        })
        .to_string();
        let put = send(
            &mut store,
            Method::PUT,
            "/v2/g/manifests/v1",
            manifest.as_bytes(),
        );
        assert_eq!(put.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            send(&mut store, Method::PUT, "/v2/g/manifests/v1", b"not json").status(),
            StatusCode::BAD_REQUEST
        );
    }
}
