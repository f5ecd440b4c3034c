//! The one shape of a validation result: every rule reports a [`Problem`] (where, why as an
//! Event/condition reason, and a sentence a person can act on), and the rules of a kind collect
//! every problem they find rather than stopping at the first.
//!
//! The message is complete on its own (it names the field), so the webhook can join messages
//! into one denial and a controller can put one in an Event without rebuilding text.

use std::fmt;

/// One thing wrong with an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Where, as a field path such as `spec.workerGroupSpecs[0].minReplicas`.
    pub field: String,
    /// A bounded reason usable as an Event or condition reason (`InvalidRayClusterSpec`, …).
    pub reason: &'static str,
    /// What is wrong, as a sentence that reads alone.
    pub message: String,
}

impl Problem {
    pub fn new(field: impl Into<String>, reason: &'static str, message: impl Into<String>) -> Self {
        Problem {
            field: field.into(),
            reason,
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// The messages of `problems` joined with `; ` (the webhook's denial and the Events' text).
pub fn join(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| p.message.as_str())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Collects the problems of one object. Every admission rule writes its message starting with
/// the field path (`spec.suspend needs …`, `metadata.name: …`), so the path is read from there
/// and a message can never name a different field than the one recorded.
#[derive(Debug)]
pub struct Problems {
    /// The reason for problems outside `metadata` (the kind's `Invalid…Spec`).
    spec_reason: &'static str,
    /// The reason for problems in `metadata` (the kind's `Invalid…Metadata`).
    metadata_reason: &'static str,
    found: Vec<Problem>,
}

impl Problems {
    pub fn new(spec_reason: &'static str, metadata_reason: &'static str) -> Self {
        Problems {
            spec_reason,
            metadata_reason,
            found: Vec::new(),
        }
    }

    /// Records `message`, whose leading field path becomes the problem's field.
    pub fn push(&mut self, message: String) {
        let field = leading_path(&message).to_owned();
        let reason = if field.starts_with("metadata") {
            self.metadata_reason
        } else {
            self.spec_reason
        };
        self.found.push(Problem {
            field,
            reason,
            message,
        });
    }

    pub fn extend(&mut self, messages: impl IntoIterator<Item = String>) {
        for message in messages {
            self.push(message);
        }
    }

    pub fn into_vec(self) -> Vec<Problem> {
        self.found
    }
}

/// The field path a message starts with: up to the first space or `:` outside brackets (a
/// bracketed label key may hold either).
fn leading_path(message: &str) -> &str {
    let mut depth = 0usize;
    for (i, c) in message.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ' ' | ':' if depth == 0 => return &message[..i],
            _ => {}
        }
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_field_is_the_messages_leading_path_and_metadata_has_its_own_reason() {
        let mut problems = Problems::new("Spec", "Meta");
        problems.push("spec.workerGroupSpecs[0].minReplicas must not be negative".into());
        problems.push("metadata.annotations[ray.io/ft-enabled] cannot be used".into());
        problems.push("spec.headGroupSpec.labels[a b:c]: \"x\" is not a valid label value".into());
        problems.push("spec.rayClusterConfig: minReplicas (3) must not exceed".into());
        let found = problems.into_vec();
        let fields: Vec<&str> = found.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.workerGroupSpecs[0].minReplicas",
                "metadata.annotations[ray.io/ft-enabled]",
                "spec.headGroupSpec.labels[a b:c]",
                "spec.rayClusterConfig"
            ]
        );
        assert_eq!(found[1].reason, "Meta");
        assert_eq!(found[0].reason, "Spec");
        assert_eq!(
            join(&found[..2]),
            "spec.workerGroupSpecs[0].minReplicas must not be negative; metadata.annotations[ray.io/ft-enabled] cannot be used"
        );
    }
}
