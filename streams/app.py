"""The one Faust app of the streams worker process, built from the settings it is given.

Its id is the Kafka consumer group; its fetch size is above the topics' record limit.
Topics are created beforehand (``onceflow topics create``), so the app never declares
them; there are no tables, so no changelogs. Its consumer hands fetched records on
without a task per record (:mod:`streams.transport`).
Nothing here runs at import: ``streams.worker.run_worker`` builds the app, declares
the topic and registers the agent, all from one ``Settings``.
"""

from __future__ import annotations

import faust

from onceflow.settings import Settings
from streams.transport import App, QuietMonitor


def create_app(settings: Settings) -> faust.App:
    datadir = settings.state_dir / "faust"
    datadir.parent.mkdir(parents=True, exist_ok=True)
    brokers = [f"kafka://{hp.strip()}" for hp in settings.kafka_bootstrap_servers.split(",")]
    return App(
        settings.consumer_group,
        broker=brokers,
        web_enabled=False,
        Monitor=QuietMonitor,
        topic_allow_declare=False,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=settings.streams_commit_interval_seconds,
        broker_session_timeout=settings.streams_session_timeout_seconds,
        broker_heartbeat_interval=settings.streams_session_timeout_seconds / 4,
        datadir=str(datadir),
        stream_buffer_maxsize=max(4096, settings.streams_batch_size * 2),
        # Per partition, at least one whole record batch of the largest size the topic
        # takes, so a big record is fetched (and dead-lettered), never stalled on.
        consumer_max_fetch_size=settings.kafka_max_message_bytes + 64 * 1024,
    )
