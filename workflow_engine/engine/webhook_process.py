"""``onceflow webhooks run``: the webhook dispatcher as its own process (the engines
then run with ``ONCEFLOW_ENGINE_WEBHOOKS=false``). Several may run: they share the
events in the consumer group and the deliveries through the claim."""

from __future__ import annotations

import asyncio
import os
import signal
import socket

from ulid import ULID

from onceflow.errors import ConfigurationError
from onceflow.health import serve_metrics_and_health
from onceflow.logs import setup_logging
from onceflow.settings import Settings
from workflow_engine.definitions import load_workflow_modules
from workflow_engine.engine.configs import webhook_config
from workflow_engine.engine.webhook_dispatcher import WebhookDispatcher
from workflow_engine.store import check_connection, database_ready, make_engine


def run_webhooks(settings: Settings) -> None:
    setup_logging(settings.log_level, settings.log_format, "webhooks")
    if not settings.webhook_endpoints:
        raise ConfigurationError("no webhook endpoints configured (ONCEFLOW_WEBHOOK_ENDPOINTS)")
    registry = load_workflow_modules(settings.workflow_modules)
    db = make_engine(settings.database_url, pool_size=4)
    check_connection(db)
    owner = f"{socket.gethostname()}:{os.getpid()}:{str(ULID())[-6:]}:webhooks"
    dispatcher = WebhookDispatcher(
        db, registry, settings.webhook_endpoints, webhook_config(settings), owner
    )
    serve_metrics_and_health(
        settings.webhooks_metrics_port,
        lambda: {"postgres": database_ready(settings.database_url)},
    )
    asyncio.run(_main(dispatcher))


async def _main(dispatcher: WebhookDispatcher) -> None:
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    dispatcher.start()
    await done.wait()
    await dispatcher.stop()
