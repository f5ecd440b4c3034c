"""Test-only models for the rollout router's Ray test (test_router_ray.py): a canary version
whose classifier fails on every request, so the router's retry on stable can be seen."""

from samples.models import Classifier


class FailingClassifier(Classifier):
    """The sample classifier (same init arguments and user_config) that always raises."""

    def __call__(self, payload) -> dict:
        raise RuntimeError(f"classifier {self.label} fails on every request (rollout test)")
