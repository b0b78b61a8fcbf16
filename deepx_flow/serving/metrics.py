"""The served models' metrics in Prometheus's text format: `GET /metrics` on the metrics
port (`--metrics-port`, 8002, as Triton's) and on the HTTP port.

Read at each scrape from the repository's statistics (the numbers the protocol's
statistics call reports), per model and version:

    deepx_inference_request_success_total      requests answered
    deepx_inference_request_failure_total      requests refused or failed
    deepx_inference_count_total                rows inferred (a request of 8 rows counts 8)
    deepx_inference_exec_count_total           executions (a batch of requests counts 1)
    deepx_inference_chunked_total              requests run as a chunked plan on the cluster
    deepx_inference_request_duration_seconds   each request, end to end (histogram)
    deepx_inference_queue_duration_seconds     each request's wait for its batch (histogram)
    deepx_inference_batch_size                 rows per execution (histogram)
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LABELS = ["model", "version"]


class ServingCollector:
    """A Prometheus collector over a ModelRepository's statistics."""

    def __init__(self, models):
        self.models = models

    def collect(self):
        counters = {
            "deepx_inference_request_success": ("requests answered", []),
            "deepx_inference_request_failure": ("requests refused or failed", []),
            "deepx_inference_count": ("rows inferred", []),
            "deepx_inference_exec_count": ("executions (a batch of requests counts one)", []),
            "deepx_inference_chunked": ("requests too large for one task, run as a chunked "
                                        "plan on the cluster", [])}
        histograms = {
            "deepx_inference_request_duration_seconds": ("each request, end to end", []),
            "deepx_inference_queue_duration_seconds": ("each request's wait for its batch",
                                                       []),
            "deepx_inference_batch_size": ("rows per execution", [])}
        for name, version, s in self.models.snapshot():
            labels = [name, version]
            counters["deepx_inference_request_success"][1].append((labels, s.success.count))
            counters["deepx_inference_request_failure"][1].append((labels, s.fail.count))
            counters["deepx_inference_count"][1].append((labels, s.inference_count))
            counters["deepx_inference_exec_count"][1].append((labels, s.execution_count))
            counters["deepx_inference_chunked"][1].append((labels, s.chunked))
            for metric, h in (("deepx_inference_request_duration_seconds", s.latency),
                              ("deepx_inference_queue_duration_seconds", s.queue_latency)):
                histograms[metric][1].append((labels, h.cumulative(), h.sum))
            histograms["deepx_inference_batch_size"][1].append(
                (labels, *_batch_buckets(s.batches)))
        for metric, (text, samples) in counters.items():
            family = CounterMetricFamily(metric, text, labels=LABELS)
            for labels, value in samples:
                family.add_metric(labels, value)
            yield family
        for metric, (text, samples) in histograms.items():
            family = HistogramMetricFamily(metric, text, labels=LABELS)
            for labels, buckets, total in samples:
                family.add_metric(labels, buckets, total)
            yield family


def _batch_buckets(batches: dict) -> tuple[list, float]:
    """Cumulative buckets (1, 2, 4, ... rows) and the sum of rows, of executions by size."""
    largest = max(batches, default=1)
    bounds, bound = [], 1
    while bound < largest:
        bounds.append(bound)
        bound *= 2
    bounds.append(bound)
    buckets = []
    for b in bounds:
        buckets.append((str(b), sum(d.count for size, d in batches.items() if size <= b)))
    buckets.append(("+Inf", sum(d.count for d in batches.values())))
    total = float(sum(size * d.count for size, d in batches.items()))
    return buckets, total


def metrics_text(models) -> bytes:
    """The exposition of `models`' metrics (none without a repository)."""
    registry = CollectorRegistry(auto_describe=False)
    if models is not None:
        registry.register(ServingCollector(models))
    return generate_latest(registry)
