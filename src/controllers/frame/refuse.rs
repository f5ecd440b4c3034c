//! The one policy for input a controller refuses (a spec its rule book rejects): a `warn` line,
//! a Warning Event with the rule book's reason and words under the action `Validate`, and no
//! retry until the object changes, since nothing but a new spec can fix it. A kind with a
//! condition for it (RayService's Ready, RayJob's `ValidationFailed`) records that as well;
//! nothing else is written and nothing that already runs is touched.

use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

/// Announces the refusal of `object` and says what the pass returns: wait for a change.
pub async fn refuse<K>(
    recorder: &crate::k8s::EventRecorder,
    object: &K,
    reason: &str,
    message: &str,
) -> Action
where
    K: Resource<DynamicType = ()>,
{
    tracing::warn!(reason, message, "{} refused", K::kind(&()));
    crate::k8s::publish_event(
        recorder,
        object,
        EventType::Warning,
        reason,
        "Validate",
        message.to_owned(),
    )
    .await;
    Action::await_change()
}
