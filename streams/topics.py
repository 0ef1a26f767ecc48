"""Topics of the streams worker, declared once. Records are raw bytes: the envelope is
decoded by :mod:`streams.records` so that a malformed record can be dead-lettered
instead of crashing the agent."""

from streams.app import app, settings

jobs_topic = app.topic(
    settings.jobs_topic,
    key_type=bytes,
    value_type=bytes,
    key_serializer="raw",
    value_serializer="raw",
)
