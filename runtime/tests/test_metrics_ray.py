"""Per-node metrics on a real Ray (the pinned ray[serve] of raypipe's test venv) on 127.0.0.1
only: the rendered ensemble graph, plus a node that times out and a shadow node that fails,
deployed as the operator does (the Serve config PUT to the dashboard); after a known number of
requests, the head's metrics export port shows exactly those counts per node and outcome, one
overhead sample per request and the requests by status class.

Skipped when Ray is not importable, unless RAYPIPE_REQUIRE_RAY=1 (then it fails).
"""

import os
import time
import urllib.request

import pytest
from conftest import rendered
from loopback_http import post
from rayhead import LOOPBACK

try:
    from prometheus_client.parser import text_string_to_metric_families
    from ray import serve  # noqa: F401
except ImportError:  # pragma: no cover - depends on the interpreter
    if os.environ.get("RAYPIPE_REQUIRE_RAY") == "1":
        raise
    pytest.skip("ray[serve] is not installed in this interpreter", allow_module_level=True)

from test_ray_serve import head, put_config, wait_running  # noqa: F401 (head: a fixture)

APP = "metrics"
REQUESTS = 6
# Ray exports every metric with its `ray_` prefix; counters gain `_total`.
NODE_REQUESTS = "ray_raypipe_node_requests_total"
GRAPH_REQUESTS = "ray_raypipe_graph_requests_total"
OVERHEAD_COUNT = "ray_raypipe_graph_overhead_ms_count"
LATENCY_COUNT = "ray_raypipe_node_latency_ms_count"


def metrics_config(head):
    """The rendered ensemble, where model_b (soft) fails every call, plus `slow` (soft, its
    200 ms timeout cuts a 1 s call) and `audit` (a shadow that fails every call)."""
    config = rendered("ensemble")
    (app,) = config["applications"]
    app["name"], app["route_prefix"] = APP, "/" + APP
    graph = app["args"]["graph"]
    graph["labels"] = {"team": "search", "tier": "gold"}
    model_b = next(n for n in graph["nodes"] if n["name"] == "model_b")
    model_b["model"]["init_kwargs"]["error_share"] = 1.0
    graph["nodes"] += [
        {
            "name": "slow",
            "model": {"import_path": "samples.models:Classifier", "init_kwargs": {"label": "slow", "delay_ms": 1000}},
            "timeout_ms": 200,
            "on_error": "SKIP",
        },
        {
            "name": "audit",
            "model": {
                "import_path": "samples.models:Classifier",
                "init_kwargs": {"label": "audit", "error_share": 1.0},
            },
            "shadow": {},
        },
    ]
    graph["edges"] += [
        {"source": "preprocess", "target": "slow"},
        {"source": "slow", "target": "combine", "into": "/slow", "optional": True},
        {"source": "preprocess", "target": "audit"},
    ]
    for name in ("slow", "audit"):
        app["deployments"].append({"name": name, "ray_actor_options": {"num_cpus": 0.1}})
    config["http_options"] = {"host": LOOPBACK, "port": head.ports["serve_http"]}
    config["proxy_location"] = "HeadOnly"
    return config


def scrape(head) -> dict:
    """{(sample name, frozenset of tags that matter): value} of this app's raypipe samples."""
    url = f"http://{LOOPBACK}:{head.ports['metrics']}/metrics"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as response:
        text = response.read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "raypipe_" in sample.name and sample.labels.get("application") == APP:
                key = (
                    sample.name,
                    frozenset((k, v) for k, v in sample.labels.items() if k in ("node", "outcome", "status_class")),
                )
                found[key] = found.get(key, 0) + sample.value
                found.setdefault(("tags", sample.name), dict(sample.labels))
    return found


def count(found, name, **tags):
    return found.get((name, frozenset(tags.items())), 0)


def test_node_outcomes_latency_and_overhead_reach_the_ray_metrics_port(head):
    put_config(head, metrics_config(head))
    wait_running(APP)
    url = head.serve_url + "/" + APP

    status, body, headers = post(url, {"text": "a great day"}, {"x-raypipe-trace": "1"})
    assert (status, body) == (200, {"score": 0.6667, "votes": {"a": 0.6667}}), (status, body)
    timing = headers.get("server-timing", "")
    assert "preprocess;dur=" in timing and "model_a;dur=" in timing and "_overhead;dur=" in timing, timing
    for _ in range(REQUESTS - 1):
        status, body, _ = post(url, {"text": "a great day"})
        assert status == 200, body

    expected = {
        ("preprocess", "ok"): REQUESTS,
        ("model_a", "ok"): REQUESTS,
        ("model_b", "error"): REQUESTS,
        ("slow", "timeout"): REQUESTS,
        ("audit", "shadow_failed"): REQUESTS,
        ("combine", "ok"): REQUESTS,
    }
    # Ray's metrics agent exports what replicas recorded a few seconds later: poll.
    deadline = time.monotonic() + 90
    while True:
        found = scrape(head)
        outcomes = {
            (dict(tags)["node"], dict(tags)["outcome"]): value
            for (name, tags), value in found.items()
            if name == NODE_REQUESTS
        }
        done = (
            outcomes == expected
            and count(found, GRAPH_REQUESTS, status_class="2xx") == REQUESTS
            and count(found, OVERHEAD_COUNT) == REQUESTS
        )
        if done or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert outcomes == expected, sorted(k for k in found if k[0] != "tags")
    assert count(found, GRAPH_REQUESTS, status_class="2xx") == REQUESTS
    assert count(found, OVERHEAD_COUNT) == REQUESTS  # one overhead sample per request
    for node in ("preprocess", "model_a", "model_b", "slow", "audit", "combine"):
        assert count(found, LATENCY_COUNT, node=node) == REQUESTS, node
    tags = found[("tags", NODE_REQUESTS)]
    assert (tags["graph"], tags["version"], tags["label_team"], tags["label_tier"]) == (
        "ensemble",
        "1",
        "search",
        "gold",
    )
    assert tags["deployment"] == "raypipe-executor"
