"""The worker's /metrics (labels tenant, endpoint, replica: one series set per replica)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 128, 256)
TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry, tenant: str, endpoint: str,
                 replica: str) -> None:
        labels = ("tenant", "endpoint", "replica")
        values = (tenant, endpoint, replica)
        self.batch_size = Histogram(
            "kestrel_worker_batch_size", "Texts per batch run", labels,
            buckets=BATCH_BUCKETS, registry=registry).labels(*values)
        self._queue_wait = Histogram(
            "kestrel_worker_queue_wait_seconds",
            "Time a request waited in the endpoint's queue before its batch started",
            (*labels, "priority"), buckets=TIME_BUCKETS, registry=registry)
        self.values = values
        self.inference = Histogram(
            "kestrel_worker_inference_seconds", "Model time of one batch (tokenise + run)",
            labels, buckets=TIME_BUCKETS, registry=registry).labels(*values)
        self.embeddings = Counter(
            "kestrel_worker_embeddings_total", "Embeddings computed and sent back", labels,
            registry=registry).labels(*values)
        self._requests = Counter(
            "kestrel_worker_requests_total", "Requests by outcome (served, expired, failed)",
            (*labels, "outcome"), registry=registry)
        self.heartbeat = Gauge(
            "kestrel_worker_last_heartbeat_timestamp_seconds",
            "Unix time of this replica's last heartbeat", labels,
            registry=registry).labels(*values)
        self.claimed = Counter(
            "kestrel_worker_claimed_total",
            "Requests taken over from a replica that stopped heartbeating", labels,
            registry=registry).labels(*values)

    def queue_wait(self, priority: str, seconds: float) -> None:
        self._queue_wait.labels(*self.values, priority).observe(seconds)

    def requests(self, outcome: str, n: int = 1) -> None:
        self._requests.labels(*self.values, outcome).inc(n)
