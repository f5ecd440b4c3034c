//! Reading Kubernetes YAML the way the API server's clients do.

use serde::Deserialize;
use serde_json::Value;

/// Every non-empty document of a YAML stream, as JSON values.
///
/// Kubernetes tooling reads YAML 1.1, where a plain `0777` is an octal integer; serde_yaml reads
/// YAML 1.2 and keeps it a string. File modes (`mode`, `defaultMode`) are where manifests use
/// octal, so those are converted as kubectl would.
pub fn documents(text: &str) -> Result<Vec<Value>, serde_yaml::Error> {
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let mut value = Value::deserialize(doc)?;
        if !value.is_null() {
            octal_file_modes(&mut value);
            docs.push(value);
        }
    }
    Ok(docs)
}

fn octal_file_modes(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                if (key == "mode" || key == "defaultMode")
                    && let Some(mode) = child
                        .as_str()
                        .and_then(|s| s.strip_prefix('0'))
                        .filter(|digits| !digits.is_empty())
                        .and_then(|digits| u32::from_str_radix(digits, 8).ok())
                {
                    *child = Value::from(mode);
                } else {
                    octal_file_modes(child);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(octal_file_modes),
        _ => {}
    }
}

/// Where KubeRay's sample objects are: `$RAYPIPE_KUBERAY_SAMPLES`, else `../shared/kuberay-samples`
/// beside the repository. Panics when neither exists: tests must never pass without their data.
pub fn kuberay_samples_dir() -> std::path::PathBuf {
    let dir = std::env::var_os("RAYPIPE_KUBERAY_SAMPLES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/kuberay-samples")
        });
    assert!(
        dir.is_dir(),
        "KubeRay sample directory {} not found; set RAYPIPE_KUBERAY_SAMPLES to the directory holding KubeRay's sample YAMLs",
        dir.display()
    );
    dir
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn octal_file_modes_become_integers_and_nothing_else_changes() {
        let docs = documents(
            "a:\n  defaultMode: 0777\n  mode: 0644\n  name: '0777'\n  other: 0777\n---\n---\nb: [ {mode: 0400} ]\n",
        )
        .expect("valid YAML");
        assert_eq!(docs.len(), 2, "empty documents are skipped");
        assert_eq!(docs[0]["a"]["defaultMode"], 511);
        assert_eq!(docs[0]["a"]["mode"], 420);
        assert_eq!(docs[0]["a"]["name"], "0777");
        assert_eq!(docs[0]["a"]["other"], "0777");
        assert_eq!(docs[1]["b"][0]["mode"], 256);
    }
}
