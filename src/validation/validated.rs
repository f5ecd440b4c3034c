//! One rule book per kind, read by two judges. The webhook reports every problem the book
//! finds; a controller reports the first one (KubeRay's order and words) and otherwise goes on
//! with [`Validated`], the values the book parsed on the way, so nothing is parsed twice.

use std::ops::Deref;

use super::feature_gates::FeatureGates;
use super::problem::{Judge, Problem, Problems};

/// A kind with a rule book.
pub trait RuleBook: Sized {
    /// What the book parses while it checks (modes, schedules, durations, …).
    type Values;
    /// The reason of a controller refusal the book could not word (never expected).
    const SPEC_REASON: &'static str;
    /// Every finding, in KubeRay's controller order, and the parsed values (`None` only when
    /// the controller has a finding, because a value failed to parse).
    fn check(&self, feature_gates: &FeatureGates) -> (Problems, Option<Self::Values>);
}

/// An object the controller may act on, with the values parsed while checking it.
pub struct Validated<K: RuleBook> {
    values: K::Values,
}

impl<K: RuleBook> Validated<K> {
    pub fn into_values(self) -> K::Values {
        self.values
    }
}

impl<K: RuleBook> Deref for Validated<K> {
    type Target = K::Values;
    fn deref(&self) -> &K::Values {
        &self.values
    }
}

/// Checks `object`: `Ok` when neither judge finds anything, else every finding.
pub fn validate<K: RuleBook>(
    object: &K,
    feature_gates: &FeatureGates,
) -> Result<Validated<K>, Problems> {
    match object.check(feature_gates) {
        (problems, Some(values)) if problems.is_clear_for(Judge::Both) => Ok(Validated { values }),
        (problems, _) => Err(problems),
    }
}

/// The webhook's answer: every problem it applies (empty: admit).
pub fn for_webhook<K: RuleBook>(object: &K, feature_gates: &FeatureGates) -> Vec<Problem> {
    object.check(feature_gates).0.into_vec()
}

/// The controller's answer: KubeRay's first problem, or the parsed values to act on.
pub fn for_controller<K: RuleBook>(
    object: &K,
    feature_gates: &FeatureGates,
) -> Result<Validated<K>, Problem> {
    let (problems, values) = object.check(feature_gates);
    match (problems.into_first_for_controller(), values) {
        (Some(problem), _) => Err(problem),
        (None, Some(values)) => Ok(Validated { values }),
        (None, None) => Err(Problem::new(
            "spec",
            K::SPEC_REASON,
            "the spec could not be read",
        )),
    }
}
