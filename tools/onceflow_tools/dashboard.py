"""The Grafana dashboard, defined once in Python and written to
``deploy/grafana/onceflow-dashboard.json`` (``onceflow dashboard --write``).

Every expression uses only the ``$group`` and ``$topic`` template variables and
``$__rate_interval``; ``tests/integration/test_prometheus.py`` evaluates each one
against a real Prometheus scraping the real processes.
"""

from __future__ import annotations

from typing import Any

UID = "onceflow-overview"
RATE = "$__rate_interval"
SEL = 'consumer_group=~"$group", topic=~"$topic"'


def _q(quantile: float, metric: str, by: str = "le") -> str:
    return f"histogram_quantile({quantile}, sum by ({by}) (rate({metric}_bucket[{RATE}])))"


# (row, [(panel title, unit, [(legend, expr), ...]), ...])
ROWS: list[tuple[str, list[tuple[str, str, list[tuple[str, str]]]]]] = [
    (
        "Ingest",
        [
            (
                "HTTP requests by status",
                "reqps",
                [
                    (
                        "{{status}}",
                        f"sum by (status) (rate(onceflow_ingest_requests_total[{RATE}]))",
                    ),
                ],
            ),
            (
                "Jobs accepted and rejected",
                "ops",
                [
                    ("accepted", f"sum(rate(onceflow_ingest_jobs_accepted_total[{RATE}]))"),
                    (
                        "rejected {{reason}}",
                        f"sum by (reason) (rate(onceflow_ingest_jobs_rejected_total[{RATE}]))",
                    ),
                ],
            ),
            (
                "Produce latency (request to last Kafka ack)",
                "s",
                [
                    ("p50", _q(0.5, "onceflow_ingest_produce_latency_seconds")),
                    ("p99", _q(0.99, "onceflow_ingest_produce_latency_seconds")),
                ],
            ),
            (
                "Producer queue and Kafka errors",
                "short",
                [
                    ("queued records", "max(onceflow_ingest_producer_queue_depth)"),
                    ("kafka errors/s", f"sum(rate(onceflow_ingest_kafka_errors_total[{RATE}]))"),
                ],
            ),
        ],
    ),
    (
        "Kafka lag",
        [
            (
                "Consumer lag per partition",
                "short",
                [
                    (
                        "partition {{partition}}",
                        f"max by (partition) (onceflow_streams_consumer_lag{{{SEL}}})",
                    ),
                ],
            ),
            (
                "Total lag",
                "short",
                [
                    ("{{topic}}", f"max by (topic) (onceflow_streams_consumer_lag_total{{{SEL}}})"),
                ],
            ),
            (
                "Lag growth (records/s, 5m)",
                "short",
                [
                    (
                        "{{topic}}",
                        f"max by (topic) (deriv(onceflow_streams_consumer_lag_total{{{SEL}}}[5m]))",
                    ),
                ],
            ),
            (
                "Produce vs consume rate",
                "ops",
                [
                    (
                        "produced",
                        "sum(max by (partition) "
                        f"(rate(onceflow_streams_topic_end_offset{{{SEL}}}[{RATE}])))",
                    ),
                    (
                        "committed",
                        "sum(max by (partition) "
                        f"(rate(onceflow_streams_committed_offset{{{SEL}}}[{RATE}])))",
                    ),
                ],
            ),
            (
                "Time to drain at the current consume rate",
                "s",
                [
                    (
                        "{{topic}}",
                        f"max by (topic) (onceflow_streams_consumer_lag_total{{{SEL}}})"
                        " / on (topic) clamp_min(sum by (topic) (max by (topic, partition)"
                        f" (rate(onceflow_streams_committed_offset{{{SEL}}}[{RATE}]))), 0.001)",
                    ),
                ],
            ),
        ],
    ),
    (
        "Streams worker",
        [
            (
                "Records consumed",
                "ops",
                [
                    (
                        "{{topic}}",
                        "sum by (topic) "
                        f'(rate(onceflow_streams_records_consumed_total{{topic=~"$topic"}}[{RATE}]))',
                    ),
                ],
            ),
            (
                "Instances created, duplicates collapsed, mismatches",
                "ops",
                [
                    ("created", f"sum(rate(onceflow_streams_instances_created_total[{RATE}]))"),
                    (
                        "duplicates ({{kind}})",
                        "sum by (kind) "
                        f"(rate(onceflow_streams_duplicates_collapsed_total[{RATE}]))",
                    ),
                    (
                        "payload mismatches",
                        f"sum(rate(onceflow_streams_payload_mismatches_total[{RATE}]))",
                    ),
                ],
            ),
            (
                "Dead-lettered records by reason",
                "ops",
                [
                    (
                        "{{reason}}",
                        f"sum by (reason) (rate(onceflow_streams_dead_lettered_total[{RATE}]))",
                    ),
                ],
            ),
            (
                "Batch size",
                "short",
                [
                    ("p50", _q(0.5, "onceflow_streams_batch_size")),
                    ("p99", _q(0.99, "onceflow_streams_batch_size")),
                ],
            ),
            (
                "Database transaction latency",
                "s",
                [
                    ("p50", _q(0.5, "onceflow_streams_db_latency_seconds")),
                    ("p99", _q(0.99, "onceflow_streams_db_latency_seconds")),
                ],
            ),
            (
                "Rebalances and database retries",
                "short",
                [
                    ("rebalances (1h)", "sum(increase(onceflow_streams_rebalances_total[1h]))"),
                    ("db retries/s", f"sum(rate(onceflow_streams_db_retries_total[{RATE}]))"),
                ],
            ),
        ],
    ),
    (
        "Workflow engine",
        [
            (
                "Instances by status",
                "short",
                [
                    (
                        "{{status}}",
                        "sum by (status) (max by (workflow, status) (onceflow_engine_instances))",
                    ),
                ],
            ),
            (
                "Steps by outcome",
                "ops",
                [
                    (
                        "{{outcome}}",
                        f"sum by (outcome) (rate(onceflow_engine_steps_total[{RATE}]))",
                    ),
                ],
            ),
            (
                "Step duration",
                "s",
                [
                    ("p50", _q(0.5, "onceflow_engine_step_duration_seconds")),
                    ("p99", _q(0.99, "onceflow_engine_step_duration_seconds")),
                ],
            ),
            (
                "Claim latency and runnable backlog",
                "short",
                [
                    ("claim p99 (s)", _q(0.99, "onceflow_engine_claim_latency_seconds")),
                    ("runnable backlog", "max(onceflow_engine_runnable_backlog)"),
                    ("in flight", "sum(onceflow_engine_inflight_instances)"),
                ],
            ),
            (
                "Submission to completion",
                "s",
                [
                    ("p50", _q(0.5, "onceflow_engine_submission_to_completion_seconds")),
                    ("p99", _q(0.99, "onceflow_engine_submission_to_completion_seconds")),
                ],
            ),
            (
                "Instances finished",
                "ops",
                [
                    (
                        "{{status}}",
                        f"sum by (status) (rate(onceflow_engine_instances_finished_total[{RATE}]))",
                    ),
                ],
            ),
            (
                "Schedules: ticks and lateness",
                "short",
                [
                    (
                        "fired/s {{schedule}}",
                        "sum by (schedule)"
                        f" (rate(onceflow_engine_schedule_ticks_fired_total[{RATE}]))",
                    ),
                    (
                        "skipped (1h) {{schedule}} {{reason}}",
                        "sum by (schedule, reason)"
                        " (increase(onceflow_engine_schedule_ticks_skipped_total[1h]))",
                    ),
                    ("lateness p99 (s)", _q(0.99, "onceflow_engine_schedule_lateness_seconds")),
                    (
                        "next fire in (s) {{schedule}}",
                        "min by (schedule) (onceflow_engine_schedule_next_fire_timestamp_seconds)"
                        " - time()",
                    ),
                ],
            ),
        ],
    ),
    (
        "PostgreSQL",
        [
            (
                "Instances stored, per workflow",
                "short",
                [
                    (
                        "{{workflow}}",
                        "sum by (workflow) (max by (workflow, status) (onceflow_engine_instances))",
                    ),
                ],
            ),
            (
                "Retention and lease rescue (1h)",
                "short",
                [
                    (
                        "pruned {{kind}}",
                        "sum by (kind) (increase(onceflow_engine_pruned_total[1h]))",
                    ),
                    ("leases rescued", "sum(increase(onceflow_engine_leases_rescued_total[1h]))"),
                ],
            ),
        ],
    ),
]


def expressions() -> list[str]:
    return [expr for _, panels in ROWS for _, _, targets in panels for _, expr in targets]


def _panel(pid: int, title: str, unit: str, targets: list[tuple[str, str]], x: int, y: int):
    return {
        "id": pid,
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 8, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "expr": expr,
                "legendFormat": legend,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
            }
            for i, (legend, expr) in enumerate(targets)
        ],
    }


def build() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for row_title, row_panels in ROWS:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": row_title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        pid, y = pid + 1, y + 1
        for i, (title, unit, targets) in enumerate(row_panels):
            panels.append(_panel(pid, title, unit, targets, (i % 3) * 8, y + (i // 3) * 8))
            pid += 1
        y += ((len(row_panels) + 2) // 3) * 8

    def query_var(name: str, label: str, query: str) -> dict[str, Any]:
        return {
            "name": name,
            "label": label,
            "type": "query",
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "query": {"query": query, "refId": name},
            "definition": query,
            "refresh": 2,
            "includeAll": True,
            "multi": True,
            "allValue": ".*",
            "current": {"text": "All", "value": "$__all"},
        }

    return {
        "uid": UID,
        "title": "onceflow",
        "tags": ["onceflow", "kafka", "workflows"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                },
                query_var(
                    "group",
                    "Consumer group",
                    "label_values(onceflow_streams_consumer_lag_total, consumer_group)",
                ),
                query_var(
                    "topic",
                    "Topic",
                    'label_values(onceflow_streams_consumer_lag_total{consumer_group=~"$group"},'
                    " topic)",
                ),
            ]
        },
        "panels": panels,
    }
