"""The rollout router: one stable pipeline route in front of two graph versions (issue 17).

raypipe renders a Canary rollout as several Serve applications on one cluster: this router
application (`import_path: raypipe_runtime.router:build`, constant `args` so Serve never
restarts it) owns the pipeline's route; each graph version is its own application built by
app.py with no route, reached by handle. The operator steers the router through the
`raypipe-router` deployment's `user_config` (a live `reconfigure`):

    {"generation": "<opaque>", "retry_on_stable": true,
     "stable": {"app", "deployment", "version"},
     "canary": {"app", "deployment", "version", "weight": <percent 0..100>} | null}

Each request picks canary with probability weight/100, once, so it finishes on the version that
took it. A canary answer with status >= 500 (or a call that raised) is re-sent to stable when
`retry_on_stable`. Responses carry `x-raypipe-version` and `x-raypipe-rollout` (stable, canary
or retried). Every router replica counts per (generation, role) and reports its cumulative
counters every 0.5 s to the single `raypipe-rollout-stats` replica, which answers
`GET <route>/-/raypipe/rollout[?generation=g]` with the sum over replicas, so the operator can
judge the canary on its own traffic.

A malformed user_config is refused naming every bad field. Before any good config that fails
the replica's start (Serve shows the message); after one, the router keeps routing by the last
good config and reports the refusal as `config_error` in its `routers` entry of the snapshot,
because Serve answers a raising `reconfigure` by stopping the replica, route and all.

The choice, counting, histograms, merging and config checks are plain classes and functions
below (tested without Ray); only `RolloutRouter`, `RolloutStats` and `build` touch Serve.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
import math
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from . import engine

logger = logging.getLogger("raypipe_runtime")

ROUTER_API_VERSION = "raypipe.router.v1"
ROUTER_DEPLOYMENT = "raypipe-router"
STATS_DEPLOYMENT = "raypipe-rollout-stats"
VERSION_METHOD = "handle_request"
ROLLOUT_PATH_SUFFIX = "/-/raypipe/rollout"

HEADER_VERSION = "x-raypipe-version"
HEADER_ROLLOUT = "x-raypipe-rollout"
STABLE, CANARY, RETRIED = "stable", "canary", "retried"
ROLES = (STABLE, CANARY)

# Upper bounds (ms) of the latency histogram; one more bucket counts everything above.
BOUNDS_MS = (
    1,
    2,
    3,
    5,
    7.5,
    10,
    15,
    20,
    30,
    50,
    75,
    100,
    150,
    200,
    300,
    500,
    750,
    1000,
    1500,
    2000,
    3000,
    5000,
    10000,
    30000,
)

REPORT_INTERVAL_S = 0.5
REPORT_TIMEOUT_S = 5.0
ROUTER_LISTED_S = 30.0  # the snapshot lists routers heard from this recently
ROUTER_FORGOTTEN_S = 300.0  # after this the stats forget a silent router entirely
LEDGER_GENERATIONS = 4  # generations one router keeps counters for
# A router's first calls to a version it has not called before reach replicas that are still
# cold (first handle use, first request through each model): their latency says nothing about
# the version, so they are counted as requests and errors but left out of its latency.
WARMUP_CALLS = 5
STATS_GENERATIONS = 8  # generations the stats deployment keeps
MAX_LABEL = 128
MAX_APP_NAME = 253
WARN_EVERY_S = 60.0
LIGHT_NUM_CPUS = 0.1


class RouterConfigError(ValueError):
    """The router's args or user_config are malformed. `problems` lists (field, message)."""

    def __init__(self, what: str, problems):
        self.problems = list(problems)
        lines = "\n".join(f"  - {where}: {message}" for where, message in self.problems)
        super().__init__(f"raypipe router: invalid {what} ({len(self.problems)} problem(s)):\n{lines}")


@dataclass(frozen=True)
class Target:
    """One graph version: its application, its ingress deployment, its label for headers."""

    app: str
    deployment: str
    version: str


@dataclass(frozen=True)
class RouterConfig:
    generation: str
    stable: Target
    canary: Target | None
    weight: float  # percent of requests sent to canary
    retry_on_stable: bool

    def target(self, role: str) -> Target:
        return self.canary if role == CANARY and self.canary is not None else self.stable


# ---- config ---------------------------------------------------------------------------------


def _printable(text: str) -> bool:
    # Labels end up in response headers and query strings: visible ASCII only.
    return all(" " < ch < "\x7f" for ch in text)


def _label(obj: dict, key: str, where: str, problems: list, limit: int = MAX_LABEL) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        problems.append((f"{where}.{key}", f"must be a non-empty string, not {value!r}"[:200]))
        return ""
    if len(value) > limit or not _printable(value):
        problems.append((f"{where}.{key}", f"must be 1-{limit} visible ASCII characters"))
        return ""
    return value


def _object(value, allowed: tuple, where: str, problems: list) -> dict:
    if not isinstance(value, dict):
        problems.append((where, f"must be an object, not {type(value).__name__}"))
        return {}
    for key in value:
        if key not in allowed:
            problems.append((f"{where}.{key}", "unknown field"))
    return value


def _target(value, where: str, problems: list, extra: tuple = ()) -> Target:
    obj = _object(value, ("app", "deployment", "version", *extra), where, problems)
    return Target(
        app=_label(obj, "app", where, problems, MAX_APP_NAME),
        deployment=_label(obj, "deployment", where, problems),
        version=_label(obj, "version", where, problems),
    )


def parse_router_args(args) -> None:
    """The application's args are constant: only the contract's version, so that a Serve code
    version (which hashes args) never changes and the router is never restarted by config."""
    problems: list[tuple[str, str]] = []
    obj = _object(args, ("api_version",), "args", problems)
    if obj.get("api_version") != ROUTER_API_VERSION:
        problems.append(
            ("args.api_version", f"is {obj.get('api_version')!r}; this router understands {ROUTER_API_VERSION!r}"[:200])
        )
    if problems:
        raise RouterConfigError("application args", problems)


def parse_config(raw) -> RouterConfig:
    """Checks the `raypipe-router` user_config; raises RouterConfigError naming every bad field."""
    problems: list[tuple[str, str]] = []
    where = "user_config"
    obj = _object(raw, ("generation", "stable", "canary", "retry_on_stable"), where, problems)
    generation = _label(obj, "generation", where, problems)
    stable = _target(obj.get("stable"), f"{where}.stable", problems)
    canary = None
    weight = 0.0
    if obj.get("canary") is not None:
        canary_obj = obj["canary"]
        canary = _target(canary_obj, f"{where}.canary", problems, extra=("weight",))
        raw_weight = canary_obj.get("weight") if isinstance(canary_obj, dict) else None
        # The range check also refuses NaN and infinities (and never converts a huge int).
        if isinstance(raw_weight, bool) or not isinstance(raw_weight, (int, float)) or not 0 <= raw_weight <= 100:
            problems.append((f"{where}.canary.weight", f"must be a number from 0 to 100, not {raw_weight!r}"[:200]))
        else:
            weight = float(raw_weight)
        if canary.app and (canary.app, canary.deployment) == (stable.app, stable.deployment):
            problems.append((f"{where}.canary.app", "names the same application as stable"))
    retry = obj.get("retry_on_stable", True)
    if not isinstance(retry, bool):
        problems.append((f"{where}.retry_on_stable", f"must be true or false, not {retry!r}"[:200]))
    if problems:
        raise RouterConfigError("user_config", problems)
    return RouterConfig(generation=generation, stable=stable, canary=canary, weight=weight, retry_on_stable=retry)


def choose_role(config: RouterConfig, draw: float) -> str:
    """Canary for a draw (uniform in [0, 1)) below weight/100: weight 0 never, 100 always."""
    if config.canary is not None and draw * 100.0 < config.weight:
        return CANARY
    return STABLE


# ---- counting -------------------------------------------------------------------------------


def bucket_index(latency_ms: float) -> int:
    """The histogram bucket of a latency: the first bound it does not exceed, else overflow."""
    return bisect.bisect_left(BOUNDS_MS, latency_ms)


class Counters:
    """Requests, errors, retried, latency sum and histogram of one role in one generation."""

    def __init__(self):
        self.requests = 0
        self.errors = 0
        self.retried = 0
        self.sum_ms = 0.0
        self.buckets = [0] * (len(BOUNDS_MS) + 1)

    def record(self, latency_ms: float | None, failed: bool, retried: bool = False) -> None:
        """`latency_ms` None: a warm-up call, counted but not in the latency figures."""
        self.requests += 1
        self.errors += failed
        self.retried += retried
        if latency_ms is not None:
            latency_ms = max(0.0, latency_ms)
            self.sum_ms += latency_ms
            self.buckets[bucket_index(latency_ms)] += 1

    def add(self, other: dict) -> None:
        """Adds counters in their dict form (a router's report); ignores a malformed one."""
        try:
            values = [int(other[k]) for k in ("requests", "errors", "retried")]
            sum_ms = float(other["sum_ms"])
            buckets = [int(b) for b in other["buckets"]]
        except (KeyError, TypeError, ValueError, OverflowError):
            return
        if len(buckets) != len(self.buckets) or not math.isfinite(sum_ms):
            return
        self.requests += values[0]
        self.errors += values[1]
        self.retried += values[2]
        self.sum_ms += sum_ms
        self.buckets = [a + b for a, b in zip(self.buckets, buckets, strict=True)]

    def to_dict(self) -> dict:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "retried": self.retried,
            "sum_ms": round(self.sum_ms, 3),
            "buckets": list(self.buckets),
        }


class Ledger:
    """One router's cumulative counters per (generation, role), for the last few generations."""

    def __init__(self, keep: int = LEDGER_GENERATIONS):
        self.keep = keep
        self.generations: OrderedDict[str, dict] = OrderedDict()
        self.calls_per_app: OrderedDict[str, int] = OrderedDict()

    def warm(self, app: str) -> bool:
        """Counts a call to `app`; False for its first WARMUP_CALLS (see WARMUP_CALLS)."""
        calls = self.calls_per_app.get(app, 0)
        if calls >= WARMUP_CALLS:
            return True
        self.calls_per_app[app] = calls + 1
        self.calls_per_app.move_to_end(app)
        while len(self.calls_per_app) > 4 * self.keep:
            self.calls_per_app.popitem(last=False)
        return False

    def activate(self, generation: str) -> None:
        """The router now routes under `generation`: it becomes the newest kept."""
        self._roles(generation, newest=True)

    def record(self, generation: str, role: str, latency_ms: float | None, failed: bool, retried: bool = False) -> None:
        self._roles(generation, newest=False)[role].record(latency_ms, failed, retried)

    def report(self) -> dict:
        """Counters of the two newest generations (current and previous), in dict form."""
        newest = list(self.generations)[-2:]
        return {g: {role: c.to_dict() for role, c in self.generations[g].items()} for g in newest}

    def _roles(self, generation: str, newest: bool) -> dict:
        roles = self.generations.get(generation)
        if roles is None:
            roles = self.generations[generation] = {role: Counters() for role in ROLES}
            # Only a request that outlived several reconfigures records under a generation
            # already dropped: it goes in as the oldest, so it is the one dropped again.
            self.generations.move_to_end(generation, last=newest)
        elif newest:
            self.generations.move_to_end(generation)
        while len(self.generations) > self.keep:
            self.generations.popitem(last=False)
        return roles


class StatsBook:
    """What `raypipe-rollout-stats` holds: every router's latest report, summed per generation."""

    def __init__(self, keep: int = STATS_GENERATIONS):
        self.keep = keep
        self.by_generation: OrderedDict[str, dict] = OrderedDict()  # generation -> replica -> roles
        self.routers: dict = {}  # replica -> (seq, generation, heard at, config error)

    def accept(self, report: dict, now: float) -> None:
        """A router's cumulative report: {replica, seq, generation, config_error, counters: {g:
        {role: ...}}}.
        An older report (lower seq) than one already taken from that replica is ignored."""
        if not isinstance(report, dict):
            return
        replica, seq = report.get("replica"), report.get("seq")
        if not isinstance(replica, str) or isinstance(seq, bool) or not isinstance(seq, int):
            return
        known = self.routers.get(replica)
        if known is not None and known[0] >= seq:
            return
        generation = report.get("generation")
        error = report.get("config_error")
        self.routers[replica] = (
            seq,
            generation if isinstance(generation, str) else None,
            now,
            error[: engine.MAX_MESSAGE] if isinstance(error, str) else None,
        )
        counters = report.get("counters")
        for gen, roles in counters.items() if isinstance(counters, dict) else ():
            if not isinstance(gen, str) or not isinstance(roles, dict):
                continue
            if gen not in self.by_generation:
                self.by_generation[gen] = {}
                while len(self.by_generation) > self.keep:
                    self.by_generation.popitem(last=False)
            self.by_generation[gen][replica] = roles
        self._forget(now)

    def snapshot(self, generation: str | None, now: float) -> dict:
        self._forget(now)
        totals = {role: Counters() for role in ROLES}
        # Generations are strings: none asked for, none found.
        reports = self.by_generation.get(generation, {}) if generation is not None else {}
        for roles in reports.values():
            for role in ROLES:
                if isinstance(roles.get(role), dict):
                    totals[role].add(roles[role])
        routers = {
            replica: {"generation": gen, "age_s": round(now - at, 3), **({"config_error": error} if error else {})}
            for replica, (_, gen, at, error) in sorted(self.routers.items())
            if now - at <= ROUTER_LISTED_S
        }
        return {
            "generation": generation,
            "bounds_ms": list(BOUNDS_MS),
            "routers": routers,
            **{role: totals[role].to_dict() for role in ROLES},
        }

    def _forget(self, now: float) -> None:
        for replica in [r for r, (_, _, at, _) in self.routers.items() if now - at > ROUTER_FORGOTTEN_S]:
            del self.routers[replica]


# ---- routing one request --------------------------------------------------------------------

# (status, content, media type, headers): what a version's `handle_request` answers.
Reply = tuple
VersionCall = Callable[[Target, bytes, dict], Awaitable[Reply]]


def error_reply(code: str, message: str, status: int = 503) -> Reply:
    """An answer of the router itself, in the graph engine's error body shape."""
    body = engine.GraphError(code, None, message, status=status).body()
    return status, json.dumps(body).encode("utf-8"), "application/json", {}


def no_config_reply() -> Reply:
    return error_reply(
        "UNAVAILABLE", "the rollout router has no configuration yet (the operator has not set its user_config)"
    )


def _unavailable_reply(target: Target, exc: BaseException) -> Reply:
    code = "BACKPRESSURE" if isinstance(exc, engine.Backpressure) else "UNAVAILABLE"
    status, content, media_type, headers = error_reply(
        code,
        f"graph version {target.version!r} (application {target.app!r}) "
        f"did not answer: {engine.describe_exception(exc)}",
    )
    if isinstance(exc, engine.Backpressure):
        # As the executor answers its own backpressure: when to come back.
        headers = {**headers, "retry-after": str(engine.retry_after_seconds(exc.retry_after_s))}
    return status, content, media_type, headers


async def _timed_call(call: VersionCall, target: Target, body: bytes, headers: dict):
    """(reply, failed, latency ms) of one version call; a raise becomes a 503 reply."""
    started = time.monotonic()
    try:
        status, content, media_type, version_headers = await call(target, body, headers)
        reply = (int(status), bytes(content), str(media_type), dict(version_headers or {}))
        failed = reply[0] >= 500
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a dead replica, a missing application, a malformed answer
        reply, failed = _unavailable_reply(target, exc), True
    return reply, failed, (time.monotonic() - started) * 1000.0


def _labelled(reply: Reply, target: Target, rollout: str) -> Reply:
    status, content, media_type, headers = reply
    return status, content, media_type, {**headers, HEADER_VERSION: target.version, HEADER_ROLLOUT: rollout}


async def route_request(
    config: RouterConfig, ledger: Ledger, call: VersionCall, body: bytes, headers: dict, draw: float
) -> Reply:
    """Sends one request to the version `draw` picks; a failed canary answer is re-sent to
    stable when the config says so. Counts every version call under the config's generation
    (a retry counts as a stable request too, and as `retried` on canary)."""
    role = choose_role(config, draw)
    target = config.target(role)
    reply, failed, latency_ms = await _timed_call(call, target, body, headers)
    if role == CANARY:
        retry = failed and config.retry_on_stable
        counted = latency_ms if ledger.warm(target.app) else None
        ledger.record(config.generation, CANARY, counted, failed, retried=retry)
        if not retry:
            return _labelled(reply, target, CANARY)
        target = config.stable
        reply, failed, latency_ms = await _timed_call(call, target, body, headers)
    counted = latency_ms if ledger.warm(target.app) else None
    ledger.record(config.generation, STABLE, counted, failed)
    return _labelled(reply, target, RETRIED if role == CANARY else STABLE)


# ---- the Serve deployments ------------------------------------------------------------------


class RolloutRouter:
    """The ingress deployment `raypipe-router`: routes by its user_config, counts, reports."""

    def __init__(self, args: dict, stats):
        from ray import serve

        from .app import _ray_caller

        parse_router_args(args)
        self.replica = serve.get_replica_context().replica_tag
        self.report_to_stats = _ray_caller(stats, "report")
        self.stats_snapshot = _ray_caller(stats, "snapshot")
        self.config: RouterConfig | None = None
        self.config_error: str | None = None  # why the latest user_config was refused
        self.ledger = Ledger()
        self.callers: dict = {}  # (app, deployment) -> caller of the version's handle_request
        self.seq = 0
        self.reporter: asyncio.Task | None = None
        self.last_warning = -math.inf

    async def reconfigure(self, user_config) -> None:
        try:
            config = parse_config(user_config)
        except RouterConfigError as error:
            if self.config is None:
                raise  # nothing to keep: Serve reports the replica's start failing with this
            # Serve stops a replica whose reconfigure raises (and its replacements fail the
            # same way), which would take the pipeline's route down: keep routing by the last
            # good config and say why in every report instead.
            self.config_error = str(error)[: engine.MAX_MESSAGE]
            logger.error("raypipe router: keeping generation %s: %s", self.config.generation, error)
            self._ensure_reporter()
            return
        self.config_error = None
        self.ledger.activate(config.generation)
        wanted = _callable_targets(config)
        self.callers = {key: caller for key, caller in self.callers.items() if key in wanted}
        self.config = config
        for target in (config.stable, config.canary):
            await self._prefetch(target)
        canary = (
            f"canary {config.canary.version} ({config.canary.app}) at {config.weight:g}%"
            if config.canary
            else "no canary"
        )
        logger.info(
            "raypipe router: generation %s: stable %s (%s), %s",
            config.generation,
            config.stable.version,
            config.stable.app,
            canary,
        )
        self._ensure_reporter()

    async def __call__(self, request):
        from starlette.responses import Response

        self._ensure_reporter()
        if request.method == "GET" and request.url.path.endswith(ROLLOUT_PATH_SUFFIX):
            reply = await self._rollout_snapshot(request.query_params.get("generation"))
        elif self.config is None:
            reply = no_config_reply()
        else:
            reply = await route_request(
                self.config,
                self.ledger,
                self._call_version,
                await request.body(),
                dict(request.headers),
                random.random(),
            )
        status, content, media_type, headers = reply
        return Response(content=content, status_code=status, media_type=media_type, headers=headers)

    async def _call_version(self, target: Target, body: bytes, headers: dict) -> Reply:
        return await (await self._caller(target))(body, headers)

    async def _caller(self, target: Target):
        from ray import serve

        from .app import _ray_caller

        key = (target.app, target.deployment)
        caller = self.callers.get(key)
        if caller is None:
            try:
                # It asks the controller whether the deployment exists (a blocking ray.get):
                # off the event loop, and only until the handle is cached.
                handle = await asyncio.to_thread(serve.get_deployment_handle, target.deployment, app_name=target.app)
            except KeyError:
                raise engine.Unavailable(
                    f"application {target.app!r} has no deployment {target.deployment!r}"
                ) from None
            caller = _ray_caller(handle, VERSION_METHOD)
            if self.config is not None and key in _callable_targets(self.config):
                self.callers[key] = caller
        return caller

    async def _prefetch(self, target: Target | None) -> None:
        """Resolves a version's handle ahead of its first request (so that request's latency
        is the version's own); a version that is not there yet is resolved when called."""
        if target is None:
            return
        try:
            await asyncio.wait_for(self._caller(target), REPORT_TIMEOUT_S)
        except Exception as exc:
            logger.info("raypipe router: %s", engine.describe_exception(exc)[:300])

    async def _rollout_snapshot(self, generation: str | None) -> Reply:
        if not generation and self.config is not None:
            generation = self.config.generation
        try:
            await asyncio.wait_for(self._send_report(), REPORT_TIMEOUT_S)
            snapshot = await asyncio.wait_for(self.stats_snapshot(generation), REPORT_TIMEOUT_S)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return error_reply(
                "UNAVAILABLE",
                f"the rollout statistics ({STATS_DEPLOYMENT}) did not answer: {engine.describe_exception(exc)}",
            )
        return 200, json.dumps(snapshot).encode("utf-8"), "application/json", {}

    async def _send_report(self) -> None:
        self.seq += 1
        await self.report_to_stats(
            {
                "replica": self.replica,
                "seq": self.seq,
                "generation": self.config.generation if self.config else None,
                "config_error": self.config_error,
                "counters": self.ledger.report(),
            }
        )

    def _ensure_reporter(self) -> None:
        if self.reporter is None or self.reporter.done():
            self.reporter = asyncio.get_running_loop().create_task(self._report_forever())

    async def _report_forever(self) -> None:
        """Every REPORT_INTERVAL_S, off the request path; a failed report is only logged."""
        while True:
            await asyncio.sleep(REPORT_INTERVAL_S)
            try:
                await asyncio.wait_for(self._send_report(), REPORT_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                now = time.monotonic()
                if now - self.last_warning >= WARN_EVERY_S:
                    self.last_warning = now
                    logger.warning(
                        "raypipe router: reporting to %s failed (requests are not affected): %s",
                        STATS_DEPLOYMENT,
                        engine.describe_exception(exc)[:300],
                    )


def _callable_targets(config: RouterConfig) -> set:
    return {(t.app, t.deployment) for t in (config.stable, config.canary) if t is not None}


class RolloutStats:
    """The single-replica deployment `raypipe-rollout-stats`: sums the routers' reports."""

    def __init__(self):
        self.book = StatsBook()

    async def report(self, report: dict) -> None:
        self.book.accept(report, time.monotonic())

    async def snapshot(self, generation: str | None = None) -> dict:
        return self.book.snapshot(generation, time.monotonic())


def build(args: dict):
    """Serve application builder: the router bound to its stats deployment."""
    from .app import EXECUTOR_MAX_ONGOING_REQUESTS, serve_deployment

    parse_router_args(args)
    # Both mostly wait or do little per call, so like the executor they take many at once, and
    # reserve a tenth of a CPU rather than Serve's default of a whole one. The Serve config's
    # `deployments` entries override both.
    light = {"max_ongoing_requests": EXECUTOR_MAX_ONGOING_REQUESTS, "ray_actor_options": {"num_cpus": LIGHT_NUM_CPUS}}
    stats = serve_deployment(RolloutStats, name=STATS_DEPLOYMENT, num_replicas=1, **light)
    router = serve_deployment(RolloutRouter, name=ROUTER_DEPLOYMENT, **light)
    return router.bind(args, stats.bind())
