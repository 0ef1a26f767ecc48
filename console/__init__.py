"""The operator's web console (``onceflow console``): overview, instance lists and
pages, control actions, bulk operations and dead-letter re-drive, read through the
store layer (no SQL of its own) and served by its own process."""

from console.app import create_app

__all__ = ["create_app"]
