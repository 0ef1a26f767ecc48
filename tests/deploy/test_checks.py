"""Shared checks for deployment files: commands and settings must be real."""

from __future__ import annotations

import click

from onceflow.settings import Settings
from onceflow_cli import cli

ALIASES = {"KAFKA_BOOTSTRAP_SERVERS", "DATABASE_URL"}


def is_onceflow_command(args: list[str]) -> bool:
    """True if ``args`` (without the program name) name a real ``onceflow`` subcommand."""
    command: click.Command = cli
    words = [a for a in args if not a.startswith("-")]
    if not words:
        return False
    for word in words:
        if not isinstance(command, click.Group) or word not in command.commands:
            return False
        command = command.commands[word]
        if not isinstance(command, click.Group):
            return True
    return not isinstance(command, click.Group)


def is_setting(env_name: str) -> bool:
    if env_name in ALIASES:
        return True
    if not env_name.startswith("ONCEFLOW_"):
        return False
    return env_name[len("ONCEFLOW_") :].lower() in Settings.model_fields


def test_checks_themselves():
    assert is_onceflow_command(["topics", "create"])
    assert is_onceflow_command(["engine"])
    assert not is_onceflow_command(["topics"])
    assert not is_onceflow_command(["enginee"])
    assert is_setting("ONCEFLOW_INGEST_PORT") and not is_setting("ONCEFLOW_INGEST_PROT")
