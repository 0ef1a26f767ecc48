"""One base exception for the whole project; the CLI turns any of these into one line."""


class OnceflowError(Exception):
    """Base class of every error onceflow raises on purpose."""


class ConfigurationError(OnceflowError):
    """A setting is missing or invalid."""


class ServiceUnavailable(OnceflowError):
    """A service onceflow depends on (Kafka, PostgreSQL) cannot be reached."""


class InvalidEnvelope(OnceflowError):
    """A Kafka record is not a valid job envelope; the message says why."""
