//! The one object-store interface history is written through (the `object_store` crate), built
//! from KubeRay's collector settings: `STORAGE_BACKEND` `s3`, `gcs`, `azureblob`, `aliyunoss`
//! (its S3-compatible API) and raypipe's `local` (a directory), each with KubeRay's variables.
//! Secrets (keys, connection strings) are read from the environment and never printed.

use std::collections::BTreeMap;
use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::local::LocalFileSystem;
use object_store::{ObjectStore, RetryConfig};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "STORAGE_BACKEND {0:?} is not one of s3, gcs, azureblob, aliyunoss, local (case does not matter)"
    )]
    UnknownBackend(String),
    #[error("the {backend} backend needs {variable}")]
    Missing {
        backend: &'static str,
        variable: &'static str,
    },
    #[error("the {backend} backend: {message}")]
    Build {
        backend: &'static str,
        /// object_store's message; it names settings, never their secret values.
        message: String,
    },
}

/// Default bucket / container of KubeRay's collector.
const DEFAULT_BUCKET: &str = "ray-historyserver";

/// A few quick retries inside one upload; the collector's own loop backs off beyond that
/// (object_store's default would hold one upload for minutes while the sink is down).
fn retries() -> RetryConfig {
    RetryConfig {
        max_retries: 2,
        retry_timeout: std::time::Duration::from_secs(10),
        ..RetryConfig::default()
    }
}

/// Builds the store `STORAGE_BACKEND` names from `env` (the process environment in use).
pub fn from_env(env: &BTreeMap<String, String>) -> Result<Arc<dyn ObjectStore>, StoreError> {
    // The HTTP backends build a reqwest client, which needs the process's TLS provider.
    crate::tls::install_crypto_provider();
    let get = |name: &str| env.get(name).map(String::as_str).filter(|v| !v.is_empty());
    let backend = get("STORAGE_BACKEND")
        .unwrap_or_default()
        .to_ascii_lowercase();
    let build = |backend: &'static str| {
        move |e: object_store::Error| StoreError::Build {
            backend,
            message: e.to_string(),
        }
    };
    match backend.as_str() {
        "local" => {
            let dir = get("RAYPIPE_HISTORY_LOCAL_DIR").ok_or(StoreError::Missing {
                backend: "local",
                variable: "RAYPIPE_HISTORY_LOCAL_DIR",
            })?;
            std::fs::create_dir_all(dir).map_err(|e| StoreError::Build {
                backend: "local",
                message: format!("{dir}: {e}"),
            })?;
            Ok(Arc::new(
                LocalFileSystem::new_with_prefix(dir).map_err(build("local"))?,
            ))
        }
        "s3" => s3(
            "s3",
            get("S3_BUCKET").unwrap_or(DEFAULT_BUCKET),
            get("S3_ENDPOINT"),
            get("S3_REGION"),
            get("S3FORCE_PATH_STYLE") == Some("true"),
            get("S3DISABLE_SSL") == Some("true"),
            env,
        ),
        // Alibaba Cloud OSS speaks S3's API at its endpoint, virtual-hosted style.
        "aliyunoss" => s3(
            "aliyunoss",
            get("OSS_BUCKET").ok_or(StoreError::Missing {
                backend: "aliyunoss",
                variable: "OSS_BUCKET",
            })?,
            get("OSS_ENDPOINT"),
            get("OSS_REGION"),
            false,
            false,
            env,
        ),
        "gcs" => {
            let bucket = get("GCS_BUCKET").ok_or(StoreError::Missing {
                backend: "gcs",
                variable: "GCS_BUCKET",
            })?;
            let mut builder = GoogleCloudStorageBuilder::new()
                .with_bucket_name(bucket)
                .with_retry(retries());
            if let Some(path) = get("GOOGLE_APPLICATION_CREDENTIALS") {
                builder = builder.with_application_credentials(path);
            }
            Ok(Arc::new(builder.build().map_err(build("gcs"))?))
        }
        "azureblob" => azure(env),
        other => Err(StoreError::UnknownBackend(other.to_owned())),
    }
}

fn s3(
    backend: &'static str,
    bucket: &str,
    endpoint: Option<&str>,
    region: Option<&str>,
    path_style: bool,
    disable_ssl: bool,
    env: &BTreeMap<String, String>,
) -> Result<Arc<dyn ObjectStore>, StoreError> {
    let mut builder = AmazonS3Builder::new()
        .with_bucket_name(bucket)
        .with_region(region.unwrap_or("us-east-1"))
        .with_retry(retries());
    if let Some(endpoint) = endpoint {
        let endpoint = if endpoint.contains("://") {
            endpoint.to_owned()
        } else if disable_ssl {
            format!("http://{endpoint}")
        } else {
            format!("https://{endpoint}")
        };
        builder = builder
            .with_allow_http(endpoint.starts_with("http://"))
            .with_endpoint(endpoint)
            .with_virtual_hosted_style_request(!path_style);
    }
    // Static keys when given (as KubeRay's collector); else the role's own credentials.
    for (name, key) in [
        (
            "AWS_ACCESS_KEY_ID",
            object_store::aws::AmazonS3ConfigKey::AccessKeyId,
        ),
        (
            "AWS_SECRET_ACCESS_KEY",
            object_store::aws::AmazonS3ConfigKey::SecretAccessKey,
        ),
        (
            "AWS_SESSION_TOKEN",
            object_store::aws::AmazonS3ConfigKey::Token,
        ),
        (
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            object_store::aws::AmazonS3ConfigKey::WebIdentityTokenFile,
        ),
        (
            "AWS_ROLE_ARN",
            object_store::aws::AmazonS3ConfigKey::RoleArn,
        ),
    ] {
        if let Some(value) = env.get(name).filter(|v| !v.is_empty()) {
            builder = builder.with_config(key, value);
        }
    }
    Ok(Arc::new(builder.build().map_err(|e| {
        StoreError::Build {
            backend,
            message: e.to_string(),
        }
    })?))
}

/// Azure Blob: a connection string (`AccountName=…;AccountKey=…[;BlobEndpoint=…]`) or an account
/// URL with the Pod's workload identity, into `AZURE_STORAGE_CONTAINER`.
fn azure(env: &BTreeMap<String, String>) -> Result<Arc<dyn ObjectStore>, StoreError> {
    let get = |name: &str| env.get(name).map(String::as_str).filter(|v| !v.is_empty());
    let container = get("AZURE_STORAGE_CONTAINER").unwrap_or(DEFAULT_BUCKET);
    let mut builder = MicrosoftAzureBuilder::new()
        .with_container_name(container)
        .with_retry(retries());
    if let Some(connection) = get("AZURE_STORAGE_CONNECTION_STRING") {
        let parts: BTreeMap<&str, &str> = connection
            .split(';')
            .filter_map(|part| part.split_once('='))
            .collect();
        let account = parts.get("AccountName").ok_or(StoreError::Missing {
            backend: "azureblob",
            variable: "AccountName in AZURE_STORAGE_CONNECTION_STRING",
        })?;
        builder = builder.with_account(*account);
        if let Some(key) = parts.get("AccountKey") {
            builder = builder.with_access_key(*key);
        }
        if let Some(endpoint) = parts.get("BlobEndpoint") {
            builder = builder
                .with_allow_http(endpoint.starts_with("http://"))
                .with_endpoint((*endpoint).to_owned());
        }
    } else if let Some(url) = get("AZURE_STORAGE_ACCOUNT_URL") {
        builder = builder.with_url(format!("{}/{container}", url.trim_end_matches('/')));
        if let Some(path) = get("AZURE_FEDERATED_TOKEN_FILE") {
            builder = builder.with_federated_token_file(path);
        }
        if let Some(id) = get("AZURE_CLIENT_ID") {
            builder = builder.with_client_id(id);
        }
        if let Some(tenant) = get("AZURE_TENANT_ID") {
            builder = builder.with_tenant_id(tenant);
        }
    } else {
        return Err(StoreError::Missing {
            backend: "azureblob",
            variable: "AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_ACCOUNT_URL",
        });
    }
    Ok(Arc::new(builder.build().map_err(|e| {
        StoreError::Build {
            backend: "azureblob",
            message: e.to_string(),
        }
    })?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn every_backend_builds_from_kuberays_variables() {
        let dir = tempfile::tempdir().expect("tmp");
        let local = dir.path().to_string_lossy().into_owned();
        let cases = [
            env(&[
                ("STORAGE_BACKEND", "local"),
                ("RAYPIPE_HISTORY_LOCAL_DIR", &local),
            ]),
            env(&[
                ("STORAGE_BACKEND", "S3"),
                ("S3_ENDPOINT", "127.0.0.1:9000"),
                ("S3DISABLE_SSL", "true"),
                ("S3FORCE_PATH_STYLE", "true"),
                ("AWS_ACCESS_KEY_ID", "a"),
                ("AWS_SECRET_ACCESS_KEY", "b"),
            ]),
            env(&[
                ("STORAGE_BACKEND", "aliyunoss"),
                ("OSS_BUCKET", "b"),
                ("OSS_ENDPOINT", "https://oss-cn-hangzhou.aliyuncs.com"),
                ("OSS_REGION", "cn-hangzhou"),
            ]),
            env(&[
                ("STORAGE_BACKEND", "azureblob"),
                (
                    "AZURE_STORAGE_CONNECTION_STRING",
                    "AccountName=devstoreaccount1;AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1",
                ),
            ]),
        ];
        for case in cases {
            assert!(from_env(&case).is_ok(), "{:?}", case.get("STORAGE_BACKEND"));
        }
    }

    #[test]
    fn missing_settings_are_named_and_secrets_are_not_echoed() {
        let unknown = from_env(&env(&[("STORAGE_BACKEND", "ftp")])).expect_err("refused");
        assert!(unknown.to_string().contains("\"ftp\""));
        let gcs = from_env(&env(&[("STORAGE_BACKEND", "gcs")])).expect_err("refused");
        assert_eq!(gcs.to_string(), "the gcs backend needs GCS_BUCKET");
        let azure = from_env(&env(&[
            ("STORAGE_BACKEND", "azureblob"),
            (
                "AZURE_STORAGE_CONNECTION_STRING",
                "AccountKey=c2VjcmV0LXZhbHVl",
            ),
        ]))
        .expect_err("refused");
        assert!(!azure.to_string().contains("c2VjcmV0LXZhbHVl"), "{azure}");
    }
}
