//! Schema and serde helpers shared by the `ray.io/v1` kinds: string enums, `managedBy`, embedded
//! Kubernetes types and Services, written as KubeRay's CRDs have them (no descriptions, no
//! `nullable` enum members).

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde_json::Value;

/// Schema of a string enum field: `{type: string, enum: [...]}` in declaration order, without the
/// `nullable` and `null` member schemars adds for an `Option`, as in KubeRay's CRDs.
pub(crate) fn enum_schema<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    let schema = generator.subschema_for::<T>();
    let mut values = Vec::new();
    collect_enum_values(schema.as_value(), &mut values);
    json_schema!({"type": "string", "enum": values})
}

/// The non-null values of an enum schema, whether listed in `enum` or as documented variants in
/// `oneOf` (`const` or single-value `enum`).
fn collect_enum_values(schema: &Value, values: &mut Vec<Value>) {
    if let Some(Value::Array(members)) = schema.get("enum") {
        values.extend(members.iter().filter(|v| !v.is_null()).cloned());
    }
    if let Some(value) = schema.get("const").filter(|v| !v.is_null()) {
        values.push(value.clone());
    }
    for keyword in ["oneOf", "anyOf"] {
        if let Some(Value::Array(variants)) = schema.get(keyword) {
            variants.iter().for_each(|v| collect_enum_values(v, values));
        }
    }
}

/// `managedBy`: a string that cannot change and must name KubeRay or MultiKueue (KubeRay's CEL
/// rules, without `nullable` so the rules see a plain string).
pub(crate) fn managed_by_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "x-kubernetes-validations": [
            {"rule": "self == oldSelf", "message": "the managedBy field is immutable"},
            {
                "rule": "self in ['ray.io/kuberay-operator', 'kueue.x-k8s.io/multikueue']",
                "message": "the managedBy field value must be either 'ray.io/kuberay-operator' or 'kueue.x-k8s.io/multikueue'"
            }
        ]
    })
}

/// Schema of an embedded Kubernetes type without its upstream descriptions: a PodTemplateSpec
/// alone carries hundreds of kilobytes of them, and several are embedded per CRD.
pub(crate) fn k8s_schema<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = generator.subschema_for::<T>();
    if let Some(map) = schema.as_object_mut() {
        strip_object_descriptions(map);
    }
    schema
}

/// [`k8s_schema`] for an embedded object (PodTemplateSpec, Service) whose `metadata` keeps only
/// what an embedded object may set, as in KubeRay's CRDs (the API server drops or, under strict
/// field validation, refuses other metadata fields).
pub(crate) fn k8s_object_schema<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = k8s_schema::<T>(generator);
    // k8s-openapi requires `metadata` of top-level kinds such as Service; embedded, it is optional.
    if let Some(required) = schema.get_mut("required").and_then(Value::as_array_mut) {
        required.retain(|name| name != "metadata");
        if required.is_empty() {
            schema.remove("required");
        }
    }
    if let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut)
        && properties.contains_key("metadata")
    {
        let string_map =
            serde_json::json!({"type": "object", "additionalProperties": {"type": "string"}});
        properties.insert(
            "metadata".into(),
            serde_json::json!({
                "type": "object",
                "properties": {
                    "annotations": string_map,
                    "finalizers": {"type": "array", "items": {"type": "string"}},
                    "labels": string_map,
                    "name": {"type": "string"},
                    "namespace": {"type": "string"},
                }
            }),
        );
    }
    schema
}

/// Serde of an embedded Service (`headService`, `serveService`). k8s-openapi writes `apiVersion`,
/// `kind` and `metadata` on every Service; embedded ones carry none of them unless given, so they
/// are left out (an empty `metadata` included) to write back exactly what was read.
pub(crate) mod embedded_service {
    use k8s_openapi::api::core::v1::Service;
    use serde::ser::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::Value;

    pub fn serialize<S: Serializer>(
        service: &Option<Service>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let Some(service) = service else {
            return serializer.serialize_none();
        };
        let mut value = serde_json::to_value(service).map_err(S::Error::custom)?;
        if let Some(fields) = value.as_object_mut() {
            fields.remove("apiVersion");
            fields.remove("kind");
            if fields
                .get("metadata")
                .and_then(Value::as_object)
                .is_some_and(|m| m.is_empty())
            {
                fields.remove("metadata");
            }
        }
        value.serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Service>, D::Error> {
        Option::<Service>::deserialize(deserializer)
    }
}

/// Removes `description` from a schema and all its subschemas (never a property named so), and
/// adds Kubernetes' declared defaults ([`KUBERNETES_DEFAULTS`]).
fn strip_descriptions(schema: &mut Value) {
    match schema {
        Value::Object(map) => strip_object_descriptions(map),
        Value::Array(items) => items.iter_mut().for_each(strip_descriptions),
        _ => {}
    }
}

/// The defaults Kubernetes' own types declare (`+default=`), which KubeRay's generated CRDs carry
/// and the API server applies to embedded Pod templates and Services. Without them a port stored
/// through raypipe's CRD has no `protocol` while the same template stored in another CRD (a Kueue
/// Workload's pod sets) has `TCP`, and Kueue, comparing the two, re-creates its Workload forever.
/// Each rule: the properties that identify the type, then (property, default).
const KUBERNETES_DEFAULTS: &[DefaultRule] = &[
    // ContainerPort
    (&["containerPort", "protocol"], &[("protocol", "TCP")]),
    // ServicePort
    (&["port", "targetPort", "protocol"], &[("protocol", "TCP")]),
    // RBDVolumeSource
    (
        &["monitors", "image", "keyring", "pool", "user"],
        &[
            ("keyring", "/etc/ceph/keyring"),
            ("pool", "rbd"),
            ("user", "admin"),
        ],
    ),
    // ISCSIVolumeSource
    (
        &["targetPortal", "iqn", "iscsiInterface"],
        &[("iscsiInterface", "default")],
    ),
    // ScaleIOVolumeSource
    (
        &["gateway", "system", "storageMode", "fsType"],
        &[("storageMode", "ThinProvisioned"), ("fsType", "xfs")],
    ),
    // AzureDiskVolumeSource
    (&["diskName", "diskURI", "fsType"], &[("fsType", "ext4")]),
];

/// The properties that identify a Kubernetes type, and the defaults it declares.
type DefaultRule = (
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
);

fn apply_kubernetes_defaults(schema: &mut serde_json::Map<String, Value>) {
    let Some(Value::Object(properties)) = schema.get_mut("properties") else {
        return;
    };
    for (identifying, defaults) in KUBERNETES_DEFAULTS {
        if identifying.iter().all(|p| properties.contains_key(*p)) {
            for (property, value) in *defaults {
                if let Some(Value::Object(child)) = properties.get_mut(*property) {
                    child.insert("default".into(), Value::String((*value).to_owned()));
                }
            }
        }
    }
}

fn strip_object_descriptions(schema: &mut serde_json::Map<String, Value>) {
    if schema.get("description").is_some_and(Value::is_string) {
        schema.remove("description");
    }
    apply_kubernetes_defaults(schema);
    for (keyword, child) in schema.iter_mut() {
        match keyword.as_str() {
            // Maps from property names to subschemas.
            "properties" | "patternProperties" => {
                if let Value::Object(properties) = child {
                    properties.values_mut().for_each(strip_descriptions);
                }
            }
            // Values, not schemas.
            "default" | "enum" | "const" | "example" | "examples" | "required" => {}
            _ => strip_descriptions(child),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::strip_descriptions;

    #[test]
    fn embedded_templates_and_services_carry_kubernetes_declared_defaults() {
        let mut schema = json!({"type": "object", "properties": {
            "ports": {"type": "array", "items": {"type": "object", "properties": {
                "containerPort": {"type": "integer"}, "protocol": {"type": "string"}}}},
            "svc": {"type": "object", "properties": {
                "port": {"type": "integer"}, "targetPort": {}, "protocol": {"type": "string"}}},
            "other": {"type": "object", "properties": {"protocol": {"type": "string"}}}
        }});
        strip_descriptions(&mut schema);
        assert_eq!(
            schema["properties"]["ports"]["items"]["properties"]["protocol"]["default"],
            "TCP"
        );
        assert_eq!(
            schema["properties"]["svc"]["properties"]["protocol"]["default"],
            "TCP"
        );
        assert!(schema["properties"]["other"]["properties"]["protocol"]["default"].is_null());
    }

    #[test]
    fn strip_descriptions_keeps_properties_named_description() {
        let mut schema = json!({
            "description": "gone",
            "type": "object",
            "properties": {"description": {"type": "string", "description": "gone too"}},
            "default": {"description": "a value, kept"}
        });
        strip_descriptions(&mut schema);
        assert_eq!(
            schema,
            json!({
                "type": "object",
                "properties": {"description": {"type": "string"}},
                "default": {"description": "a value, kept"}
            })
        );
    }
}
