"""``/``: instances per workflow and status, throughput, consumer lag, dead letters.
The page polls its fragment (``/overview/fragment``) every 5 s with htmx."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from console.deps import Console, ConsoleDep, reader, render
from onceflow.errors import ServiceUnavailable
from onceflow.lag import PartitionLag, consumer_lag
from onceflow.vocabulary import InstanceStatus
from workflow_engine.store.views import overview

router = APIRouter(dependencies=[Depends(reader)])


@dataclass(frozen=True)
class Bar:
    minute: datetime
    n: int
    height: int  # pixels, of CHART_HEIGHT


CHART_HEIGHT = 60


def bars(series: list[tuple[datetime, int]]) -> list[Bar]:
    top = max((n for _, n in series), default=0) or 1
    return [Bar(m, n, round(CHART_HEIGHT * n / top)) for m, n in series]


def _lag(c: Console) -> tuple[list[PartitionLag], str | None]:
    s = c.settings
    try:
        return consumer_lag(s.kafka_bootstrap_servers, s.consumer_group, s.jobs_topic, 5.0), None
    except ServiceUnavailable as exc:
        return [], str(exc)


def _context(c: Console) -> dict[str, Any]:
    view = overview(c.db, minutes=15)
    lag, lag_error = _lag(c)
    return {
        "view": view,
        "statuses": list(InstanceStatus),
        "created": bars(view.created_per_minute),
        "finished": bars(view.finished_per_minute),
        "chart_height": CHART_HEIGHT,
        "lag": lag,
        "lag_total": sum(p.lag for p in lag),
        "lag_error": lag_error,
        "topic": c.settings.jobs_topic,
        "group": c.settings.consumer_group,
        "dead_total": sum(view.dead_letters_by_reason.values()),
    }


@router.get("/")
def overview_page(request: Request, c: ConsoleDep) -> Response:
    return render(request, "overview.html", _context(c))


@router.get("/overview/fragment")
def overview_fragment(request: Request, c: ConsoleDep) -> Response:
    return render(request, "_overview.html", _context(c))
