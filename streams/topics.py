"""The topic the streams worker consumes, declared once per app. Records are raw bytes:
the envelope is decoded by :mod:`streams.records` so that a malformed record can be
dead-lettered instead of crashing the agent."""

from __future__ import annotations

import faust
from faust.types import TopicT

from onceflow.settings import Settings


def jobs_topic(app: faust.App, settings: Settings) -> TopicT:
    return app.topic(
        settings.jobs_topic,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
    )
