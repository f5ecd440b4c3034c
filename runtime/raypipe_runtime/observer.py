"""What an executor tells an observer about its requests: each model node's outcome and call
time, each request's status and graph overhead (metrics.py binds it to Ray Serve's metrics)."""

from __future__ import annotations

from .spec import NodeSpec

# A model node's outcome in one request, as the observer hears it (one per node and request
# that reached it): what the node's call did.
OUTCOME_OK = "ok"  # called and answered
OUTCOME_ERROR = "error"  # its call or its input failed, no fallback (on_error FAIL or SKIP)
OUTCOME_TIMEOUT = "timeout"  # its own timeout_ms or the request deadline ended it (FAIL or SKIP)
OUTCOME_FALLBACK = "fallback"  # failed in any way; its fallback_value was used
OUTCOME_SKIPPED = "skipped"  # never called (routed around, dead input, not sampled, not needed),
#                             or its call was cancelled because nothing needed it any more
OUTCOME_SHADOW_FAILED = "shadow_failed"  # a shadow node failed in any way (timeouts included)
OUTCOMES = (OUTCOME_OK, OUTCOME_ERROR, OUTCOME_TIMEOUT, OUTCOME_FALLBACK, OUTCOME_SKIPPED, OUTCOME_SHADOW_FAILED)


def failure_outcome(node: NodeSpec, failure_kind: str, shadow: bool) -> str:
    """The outcome of a node whose call (or input) failed with a `Failure` kind."""
    if shadow:
        return OUTCOME_SHADOW_FAILED
    if node.on_error == "FALLBACK":
        return OUTCOME_FALLBACK
    return OUTCOME_TIMEOUT if failure_kind == "TIMEOUT" else OUTCOME_ERROR


class Observer:
    """What an executor tells about its requests (metrics.py binds it to Ray Serve's metrics).
    Called on the request's event loop, so every method must be cheap; an exception is logged
    once and otherwise ignored, never failing a request.

    - `node_outcome(node, outcome)`: once per model node and request that reached it (OUTCOMES);
      nodes still pending when the response went out are not counted, nor a call cancelled
      before its task first ran (calls over a handle suspend at once, so hardly ever).
    - `node_call(node, ms)`: the time of a node's call, retries and their backoff included, for
      every call except one cancelled because nothing needed it any more.
    - `request(status, overhead_ms)`: once per answered request (not when the client went away).
      The graph overhead is the request's time in the executor (from `Executor.run` until its
      response is decided) minus the time during which at least one non-shadow node call was in
      flight: what the graph itself added to the request's latency (routing, input assembly,
      predicates, scheduling), while work that overlapped a node call is not counted.
    """

    def node_outcome(self, node: str, outcome: str) -> None:
        pass

    def node_call(self, node: str, ms: float) -> None:
        pass

    def request(self, status: int, overhead_ms: float) -> None:
        pass
