//! The `admission.k8s.io/v1` AdmissionReview, as far as a validating webhook reads and writes it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const API_VERSION: &str = "admission.k8s.io/v1";
pub const KIND: &str = "AdmissionReview";

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReview {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<AdmissionRequest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<AdmissionResponse>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    #[serde(default)]
    pub kind: GroupVersionKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    pub operation: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_object: Option<Value>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    pub uid: String,
    pub allowed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ResponseStatus>,
}

/// The `metav1.Status` shown to the user when a request is denied.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ResponseStatus {
    pub code: u16,
    pub reason: String,
    pub message: String,
}

impl AdmissionResponse {
    pub fn allow(uid: &str) -> AdmissionResponse {
        AdmissionResponse {
            uid: uid.to_owned(),
            allowed: true,
            status: None,
        }
    }

    /// Denied as `Invalid` (HTTP 422), the way the API server reports a schema violation.
    pub fn deny(uid: &str, message: String) -> AdmissionResponse {
        AdmissionResponse {
            uid: uid.to_owned(),
            allowed: false,
            status: Some(ResponseStatus {
                code: 422,
                reason: "Invalid".to_owned(),
                message,
            }),
        }
    }

    pub fn into_review(self) -> AdmissionReview {
        AdmissionReview {
            api_version: API_VERSION.to_owned(),
            kind: KIND.to_owned(),
            request: None,
            response: Some(self),
        }
    }
}
