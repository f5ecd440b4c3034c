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

/// Who applies a rule. KubeRay's webhook and its controller do not always check the same
/// things (the controller also reads the status and fields the API server defaults), so a
/// rule is tagged with its judges rather than written twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judge {
    Both,
    Webhook,
    Controller,
}

/// One rule that fired: what the webhook says (every admission message starts with the field
/// path) and what the controller says (KubeRay's words, first problem only).
#[derive(Debug)]
struct Finding {
    webhook: Option<Problem>,
    controller: Option<Problem>,
}

/// Collects the problems of one object, in KubeRay's controller order. Every admission message
/// starts with the field path (`spec.suspend needs …`, `metadata.name: …`), so the path is read
/// from there and a message can never name a different field than the one recorded.
#[derive(Debug)]
pub struct Problems {
    /// The reason for problems outside `metadata` (the kind's `Invalid…Spec`).
    spec_reason: &'static str,
    /// The reason for problems in `metadata` (the kind's `Invalid…Metadata`).
    metadata_reason: &'static str,
    found: Vec<Finding>,
}

impl Problems {
    pub fn new(spec_reason: &'static str, metadata_reason: &'static str) -> Self {
        Problems {
            spec_reason,
            metadata_reason,
            found: Vec::new(),
        }
    }

    fn reason_of(&self, field: &str) -> &'static str {
        if field.starts_with("metadata") {
            self.metadata_reason
        } else {
            self.spec_reason
        }
    }

    fn webhook_problem(&self, message: String) -> Problem {
        let field = leading_path(&message).to_owned();
        Problem {
            reason: self.reason_of(&field),
            field,
            message,
        }
    }

    /// Records a rule both judges apply with the same words; `message` leads with its field.
    pub fn push(&mut self, message: String) {
        let problem = self.webhook_problem(message);
        self.found.push(Finding {
            webhook: Some(problem.clone()),
            controller: Some(problem),
        });
    }

    pub fn extend(&mut self, messages: impl IntoIterator<Item = String>) {
        for message in messages {
            self.push(message);
        }
    }

    /// Records a rule both judges apply: the webhook's message (leading with the field) and
    /// KubeRay's words for the controller.
    pub fn both(&mut self, webhook: String, kuberay: impl Into<String>) {
        let problem = self.webhook_problem(webhook);
        let controller = Problem::new(problem.field.clone(), problem.reason, kuberay);
        self.found.push(Finding {
            webhook: Some(problem),
            controller: Some(controller),
        });
    }

    /// Records a rule only the webhook applies.
    pub fn webhook_only(&mut self, message: String) {
        let problem = self.webhook_problem(message);
        self.found.push(Finding {
            webhook: Some(problem),
            controller: None,
        });
    }

    /// Records a rule only the controller applies, on `field`, in KubeRay's words.
    pub fn controller_only(&mut self, field: &str, kuberay: impl Into<String>) {
        let reason = self.reason_of(field);
        self.controller_problem(Problem::new(field, reason, kuberay));
    }

    /// Records a rule only the controller applies, with its own reason (an invalid status).
    pub fn controller_problem(&mut self, problem: Problem) {
        self.found.push(Finding {
            webhook: None,
            controller: Some(problem),
        });
    }

    /// Records one rule whose judges may disagree on this object: each judge that finds a
    /// problem gives its own words (`None`: that judge sees nothing wrong).
    pub fn judged(&mut self, field: &str, webhook: Option<String>, kuberay: Option<String>) {
        match (webhook, kuberay) {
            (Some(w), Some(k)) => self.both(w, k),
            (Some(w), None) => self.webhook_only(w),
            (None, Some(k)) => self.controller_only(field, k),
            (None, None) => {}
        }
    }

    /// [`Self::judged`] for a rule the webhook reports once per offending item and KubeRay's
    /// controller once, for the first item.
    pub fn judged_all(&mut self, field: &str, webhook: Vec<String>, kuberay: Option<String>) {
        let mut webhook = webhook.into_iter();
        self.judged(field, webhook.next(), kuberay);
        for message in webhook {
            self.webhook_only(message);
        }
    }

    /// Whether `judge` found nothing.
    pub fn is_clear_for(&self, judge: Judge) -> bool {
        self.found.iter().all(|f| match judge {
            Judge::Both => f.webhook.is_none() && f.controller.is_none(),
            Judge::Webhook => f.webhook.is_none(),
            Judge::Controller => f.controller.is_none(),
        })
    }

    /// Every problem the webhook reports.
    pub fn into_vec(self) -> Vec<Problem> {
        self.found.into_iter().filter_map(|f| f.webhook).collect()
    }

    /// The webhook's problems, without consuming the collector.
    pub fn webhook(&self) -> Vec<Problem> {
        self.found
            .iter()
            .filter_map(|f| f.webhook.clone())
            .collect()
    }

    /// The controller's answer: the first problem in KubeRay's order.
    pub fn first_for_controller(&self) -> Option<&Problem> {
        self.found.iter().find_map(|f| f.controller.as_ref())
    }

    /// The controller's first problem, consuming the collector.
    pub fn into_first_for_controller(self) -> Option<Problem> {
        self.found.into_iter().find_map(|f| f.controller)
    }

    /// For a kind whose controller applies exactly the webhook's rules (RayService): each
    /// finding becomes the webhook's, for both judges.
    pub fn judged_as_webhook(self) -> Problems {
        Problems {
            found: self
                .found
                .into_iter()
                .filter_map(|f| f.webhook)
                .map(|problem| Finding {
                    webhook: Some(problem.clone()),
                    controller: Some(problem),
                })
                .collect(),
            ..self
        }
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
