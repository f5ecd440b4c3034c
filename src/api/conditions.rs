//! Conditions of the metav1.Condition shape, shared by every kind raypipe writes status for.

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Status values of a condition.
pub const TRUE: &str = "True";
pub const FALSE: &str = "False";
pub const UNKNOWN: &str = "Unknown";

/// Sets `new` in `conditions`, keyed by type. `lastTransitionTime` only moves when the status
/// changes, so a steady state writes identical conditions (and so no status churn).
pub fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition) {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(existing) => {
            if existing.status == new.status {
                new.last_transition_time = existing.last_transition_time.clone();
            }
            *existing = new;
        }
        None => conditions.push(new),
    }
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
}

/// Builds a condition with the given fields.
pub fn condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: Time,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.into(),
        observed_generation,
        last_transition_time: now,
    }
}

/// Finds a condition by type.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn transition_time_moves_only_when_status_changes() {
        let mut cs = Vec::new();
        set_condition(
            &mut cs,
            condition("Ready", FALSE, "Pending", "a", Some(1), at(10)),
        );
        set_condition(
            &mut cs,
            condition("Ready", FALSE, "StillPending", "b", Some(2), at(20)),
        );
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0].last_transition_time, at(10));
        assert_eq!(cs[0].reason, "StillPending");
        set_condition(
            &mut cs,
            condition("Ready", TRUE, "Ready", "c", Some(2), at(30)),
        );
        assert_eq!(cs[0].last_transition_time, at(30));
    }

    #[test]
    fn conditions_are_kept_sorted_by_type() {
        let mut cs = Vec::new();
        set_condition(&mut cs, condition("Ready", TRUE, "R", "", None, at(1)));
        set_condition(&mut cs, condition("GraphValid", TRUE, "G", "", None, at(1)));
        set_condition(
            &mut cs,
            condition("SourceReady", TRUE, "S", "", None, at(1)),
        );
        let types: Vec<_> = cs.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["GraphValid", "Ready", "SourceReady"]);
        assert_eq!(find(&cs, "Ready").unwrap().reason, "R");
    }
}
