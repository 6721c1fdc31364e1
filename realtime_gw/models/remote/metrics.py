"""What a front-end exports about the remote replicas it uses (``client.RemoteStage``), on its ``/metrics``."""

from __future__ import annotations

from prometheus_client import Gauge, Histogram

REMOTE_READY = Gauge(
    "realtime_gw_remote_worker_ready", "Remote replica warmed up and reachable", ["worker", "replica"]
)
REMOTE_FREE = Gauge(
    "realtime_gw_remote_worker_free_slots", "Free slots of a remote replica", ["worker", "replica"]
)
REMOTE_ACTIVE = Gauge(
    "realtime_gw_remote_worker_active_requests",
    "Requests a remote replica holds (all front-ends)",
    ["worker", "replica"],
)
REMOTE_QUEUE = Gauge(
    "realtime_gw_remote_worker_queue_depth",
    "Requests waiting to be opened on a remote replica",
    ["worker", "replica"],
)
REMOTE_FRONTENDS = Gauge(
    "realtime_gw_remote_worker_frontends", "Front-ends using a remote replica", ["worker", "replica"]
)
REMOTE_DELIVERY = Histogram(
    "realtime_gw_remote_delivery_seconds",
    "A remote worker step's results: handed over in the actor -> in this front-end's stream (wall clocks:"
    " across machines this includes their offset)",
    ["worker"],
    buckets=(0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25),
)
REMOTE_FAULTS = Gauge(
    "realtime_gw_remote_worker_faults",
    "Replica deaths/restarts seen by this front-end",
    ["worker", "replica"],
)
