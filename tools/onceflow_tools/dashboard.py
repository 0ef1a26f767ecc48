"""The Grafana dashboard, built with Grafana's typed builder (grafana-foundation-sdk)
and written to ``deploy/grafana/onceflow-dashboard.json`` (``onceflow dashboard --write``);
the Helm chart ships a copy (``helm/onceflow/files``), kept equal by a test.

Every expression uses only the ``$group`` and ``$topic`` template variables and
``$__rate_interval``; ``tests/integration/test_prometheus.py`` evaluates each one
against a real Prometheus scraping the real processes.

The SDK release is pinned to the Grafana 11.5 line, the newest whose dashboards are
schema 39 (the 11.6 line writes 41); Grafana 11.1, the one in docker-compose, reads 39.
"""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders import common, dashboard, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_models
from grafana_foundation_sdk.models import dashboard as models

UID = "onceflow-overview"
RATE = "$__rate_interval"
SEL = 'consumer_group=~"$group", topic=~"$topic"'
DATASOURCE = models.DataSourceRef(type_val="prometheus", uid="${datasource}")


def _q(quantile: float, metric: str, by: str = "le") -> str:
    return f"histogram_quantile({quantile}, sum by ({by}) (rate({metric}_bucket[{RATE}])))"


def _rate(metric: str, by: str = "") -> str:
    return f"sum{f' by ({by}) ' if by else ''}(rate({metric}[{RATE}]))"


def _p50_p99(metric: str) -> tuple[tuple[str, str], tuple[str, str]]:
    return ("p50", _q(0.5, metric)), ("p99", _q(0.99, metric))


def _panel(title: str, unit: str, *targets: tuple[str, str]) -> timeseries.Panel:
    """A time series, a third of the width and 8 high: the dashboard lays them out
    three to a line under their row. ``targets`` are (legend, expression) pairs."""
    panel = (
        timeseries.Panel()
        .title(title)
        .unit(unit)
        .datasource(DATASOURCE)
        .span(8)
        .height(8)
        # The SDK's defaults would hide the legend and sort the tooltip; these are
        # Grafana's own defaults for a time series.
        .legend(
            common.VizLegendOptions()
            .show_legend(True)
            .display_mode(common_models.LegendDisplayMode.LIST)
            .placement(common_models.LegendPlacement.BOTTOM)
        )
        .tooltip(
            common.VizTooltipOptions()
            .mode(common_models.TooltipDisplayMode.SINGLE)
            .sort(common_models.SortOrder.NONE)
        )
    )
    for i, (legend, expr) in enumerate(targets):
        panel.with_target(
            prometheus.Dataquery()
            .ref_id(chr(ord("A") + i))
            .expr(expr)
            .legend_format(legend)
            .datasource(DATASOURCE)
        )
    return panel


def _ingest() -> list[timeseries.Panel]:
    return [
        _panel(
            "HTTP requests by status",
            "reqps",
            ("{{status}}", _rate("onceflow_ingest_requests_total", "status")),
        ),
        _panel(
            "Jobs accepted and rejected",
            "ops",
            ("accepted", _rate("onceflow_ingest_jobs_accepted_total")),
            ("rejected {{reason}}", _rate("onceflow_ingest_jobs_rejected_total", "reason")),
        ),
        _panel(
            "Produce latency (request to last Kafka ack)",
            "s",
            *_p50_p99("onceflow_ingest_produce_latency_seconds"),
        ),
        _panel(
            "Producer queue and Kafka errors",
            "short",
            ("queued records", "max(onceflow_ingest_producer_queue_depth)"),
            ("kafka errors/s", _rate("onceflow_ingest_kafka_errors_total")),
        ),
    ]


def _kafka_lag() -> list[timeseries.Panel]:
    lag_total = f"max by (topic) (onceflow_streams_consumer_lag_total{{{SEL}}})"
    return [
        _panel(
            "Consumer lag per partition",
            "short",
            (
                "partition {{partition}}",
                f"max by (partition) (onceflow_streams_consumer_lag{{{SEL}}})",
            ),
        ),
        _panel("Total lag", "short", ("{{topic}}", lag_total)),
        _panel(
            "Lag growth (records/s, 5m)",
            "short",
            (
                "{{topic}}",
                f"max by (topic) (deriv(onceflow_streams_consumer_lag_total{{{SEL}}}[5m]))",
            ),
        ),
        _panel(
            "Produce vs consume rate",
            "ops",
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
        ),
        _panel(
            "Time to drain at the current consume rate",
            "s",
            (
                "{{topic}}",
                f"{lag_total} / on (topic) clamp_min(sum by (topic) (max by (topic, partition)"
                f" (rate(onceflow_streams_committed_offset{{{SEL}}}[{RATE}]))), 0.001)",
            ),
        ),
    ]


def _streams_worker() -> list[timeseries.Panel]:
    return [
        _panel(
            "Records consumed",
            "ops",
            (
                "{{topic}}",
                "sum by (topic) "
                f'(rate(onceflow_streams_records_consumed_total{{topic=~"$topic"}}[{RATE}]))',
            ),
        ),
        _panel(
            "Instances created, duplicates collapsed, mismatches",
            "ops",
            ("created", _rate("onceflow_streams_instances_created_total")),
            ("duplicates ({{kind}})", _rate("onceflow_streams_duplicates_collapsed_total", "kind")),
            ("payload mismatches", _rate("onceflow_streams_payload_mismatches_total")),
        ),
        _panel(
            "Dead-lettered records by reason",
            "ops",
            ("{{reason}}", _rate("onceflow_streams_dead_lettered_total", "reason")),
        ),
        _panel("Batch size", "short", *_p50_p99("onceflow_streams_batch_size")),
        _panel(
            "Database transaction latency", "s", *_p50_p99("onceflow_streams_db_latency_seconds")
        ),
        _panel(
            "Rebalances and database retries",
            "short",
            ("rebalances (1h)", "sum(increase(onceflow_streams_rebalances_total[1h]))"),
            ("db retries/s", _rate("onceflow_streams_db_retries_total")),
        ),
    ]


def _workflow_engine() -> list[timeseries.Panel]:
    by_status = "sum by (status) (max by (workflow, status) (onceflow_engine_instances))"
    return [
        _panel("Instances by status", "short", ("{{status}}", by_status)),
        _panel(
            "Steps by outcome",
            "ops",
            ("{{outcome}}", _rate("onceflow_engine_steps_total", "outcome")),
        ),
        _panel("Step duration", "s", *_p50_p99("onceflow_engine_step_duration_seconds")),
        _panel(
            "Claim latency and runnable backlog",
            "short",
            ("claim p99 (s)", _q(0.99, "onceflow_engine_claim_latency_seconds")),
            ("runnable backlog", "max(onceflow_engine_runnable_backlog)"),
            ("in flight", "sum(onceflow_engine_inflight_instances)"),
        ),
        _panel(
            "Submission to completion",
            "s",
            *_p50_p99("onceflow_engine_submission_to_completion_seconds"),
        ),
        _panel(
            "Instances finished",
            "ops",
            ("{{status}}", _rate("onceflow_engine_instances_finished_total", "status")),
        ),
        _panel(
            "Schedules: ticks and lateness",
            "short",
            (
                "fired/s {{schedule}}",
                _rate("onceflow_engine_schedule_ticks_fired_total", "schedule"),
            ),
            (
                "skipped (1h) {{schedule}} {{reason}}",
                "sum by (schedule, reason)"
                " (increase(onceflow_engine_schedule_ticks_skipped_total[1h]))",
            ),
            ("lateness p99 (s)", _q(0.99, "onceflow_engine_schedule_lateness_seconds")),
            (
                "next fire in (s) {{schedule}}",
                "min by (schedule) (onceflow_engine_schedule_next_fire_timestamp_seconds) - time()",
            ),
        ),
    ]


def _lifecycle_events() -> list[timeseries.Panel]:
    return [
        _panel(
            "Outbox depth and oldest event",
            "short",
            ("waiting events", "max(onceflow_events_outbox_depth)"),
            ("backpressure depth", "max(onceflow_events_outbox_max_depth)"),
            ("oldest (s)", "max(onceflow_events_outbox_oldest_age_seconds)"),
        ),
        _panel(
            "Events published by type",
            "ops",
            ("{{type}}", _rate("onceflow_events_published_total", "type")),
        ),
        _panel(
            "Relay lag (transaction to Kafka ack), active relays, backpressure",
            "short",
            ("lag p99 (s)", _q(0.99, "onceflow_events_relay_lag_seconds")),
            ("active relays", "sum(onceflow_events_relay_active)"),
            ("engines held back", "sum(onceflow_events_backpressure)"),
        ),
    ]


def _postgresql() -> list[timeseries.Panel]:
    per_workflow = "sum by (workflow) (max by (workflow, status) (onceflow_engine_instances))"
    return [
        _panel("Instances stored, per workflow", "short", ("{{workflow}}", per_workflow)),
        _panel(
            "Retention and lease rescue (1h)",
            "short",
            ("pruned {{kind}}", "sum by (kind) (increase(onceflow_engine_pruned_total[1h]))"),
            ("leases rescued", "sum(increase(onceflow_engine_leases_rescued_total[1h]))"),
        ),
    ]


def _webhooks() -> list[timeseries.Panel]:
    # Every dispatcher reports the same database-wide counts: max, not sum. (The
    # per-endpoint counters exist only once a dispatcher runs; these gauges always.)
    return [
        _panel(
            "Webhook deliveries: pending and dead",
            "short",
            ("pending", "max(onceflow_webhook_deliveries_pending)"),
            ("dead", "max(onceflow_webhook_deliveries_dead)"),
        ),
    ]


def _decisions(title: str, metric: str) -> timeseries.Panel:
    """A run control's decisions per workflow over the last hour."""
    return _panel(
        title,
        "short",
        (
            "{{workflow}} {{decision}}",
            f"sum by (workflow, decision) (increase({metric}[1h]))",
        ),
    )


def _run_controls() -> list[timeseries.Panel]:
    return [
        _panel(
            "Time limits reached (1h)",
            "short",
            (
                "{{workflow}} {{kind}}",
                "sum by (workflow, kind) (increase(onceflow_engine_time_limits_total[1h]))",
            ),
        ),
        _decisions("Singleton decisions (1h)", "onceflow_streams_singleton_decisions_total"),
        _decisions("Debounce decisions (1h)", "onceflow_streams_debounce_decisions_total"),
        _decisions("Id reuse decisions (1h)", "onceflow_streams_id_reuse_total"),
        _panel(
            "Batches formed (1h) and their size",
            "short",
            (
                "{{workflow}} by {{trigger}}",
                "sum by (workflow, trigger) (increase(onceflow_engine_batches_total[1h]))",
            ),
            (
                "median size",
                "histogram_quantile(0.5, sum by (le)"
                " (increase(onceflow_engine_batch_size_bucket[1h])))",
            ),
        ),
    ]


ROWS = {
    "Ingest": _ingest,
    "Kafka lag": _kafka_lag,
    "Streams worker": _streams_worker,
    "Workflow engine": _workflow_engine,
    "PostgreSQL": _postgresql,
    "Lifecycle events": _lifecycle_events,
    "Webhooks": _webhooks,
    "Run controls": _run_controls,
}


def _query_variable(name: str, label: str, query: str) -> dashboard.QueryVariable:
    return (
        dashboard.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query({"query": query, "refId": name})
        .refresh(models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .include_all(True)
        .multi(True)
        .all_value(".*")
        .current(models.VariableOption(text="All", value="$__all"))
    )


def dashboard_model() -> models.Dashboard:
    board = (
        dashboard.Dashboard("onceflow")
        .uid(UID)
        .tags(["onceflow", "kafka", "workflows"])
        .timezone("utc")
        .version(1)
        .refresh("10s")
        .time("now-1h", "now")
        .with_variable(
            dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
        )
        .with_variable(
            _query_variable(
                "group",
                "Consumer group",
                "label_values(onceflow_streams_consumer_lag_total, consumer_group)",
            )
        )
        .with_variable(
            _query_variable(
                "topic",
                "Topic",
                'label_values(onceflow_streams_consumer_lag_total{consumer_group=~"$group"},'
                " topic)",
            )
        )
    )
    # Ids in reading order, rows included; the builder places each row below the last
    # line of panels and the panels three to a line beneath it.
    pid = 1
    for title, panels in ROWS.items():
        board.with_row(dashboard.Row(title).id(pid))
        for panel in panels():
            pid += 1
            board.with_panel(panel.id(pid))
        pid += 1
    return board.build()


def build() -> dict[str, Any]:
    """The dashboard as plain JSON data (what Grafana imports)."""
    data: dict[str, Any] = json.loads(json.dumps(dashboard_model(), cls=JSONEncoder))
    return data


def expressions() -> list[str]:
    """Every PromQL expression of every panel, in order."""
    return [
        target["expr"]
        for panel in build()["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]
