"""PNG plots of ``onceflow bench`` results (matplotlib, imported lazily, Agg canvas):
``python -m onceflow_tools.benchplots results.json [more.json ...] --out docs/bench``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import click
import orjson

if TYPE_CHECKING:
    from matplotlib.axes import Axes

CAPTION = "2 cores, Kafka + PostgreSQL on the same host"
Results = dict[str, dict[str, Any]]


def load(files: list[Path]) -> list[dict[str, Any]]:
    """The scenario results of ``files``, a later file's scenario replacing an earlier one."""
    merged: Results = {}
    for path in files:
        data = orjson.loads(path.read_bytes())
        for result in data if isinstance(data, list) else [data]:
            if "scenario" not in result:
                raise click.ClickException(f"{path}: not an `onceflow bench` result")
            merged[result["scenario"]] = result
    return list(merged.values())


def _log_if_wide(ax: Axes, values: list[float], axis: str = "y") -> None:
    """A log scale, labelled 1 2 5 10 20 …, when the values span more than a factor of 20."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    positive = [v for v in values if v > 0]
    if not positive or max(positive) / min(positive) <= 20:
        return
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    target.set_minor_locator(NullLocator())


def _concurrency_axis(ax: Axes, values: list[int], label: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(values)), [str(v) for v in sorted(set(values))])
    ax.minorticks_off()
    ax.set_xlabel(label)


def _ingest_runs(by: Results) -> tuple[list[dict[str, Any]], str]:
    """Paced runs by offered load, or (none paced) flat-out runs by client concurrency."""
    runs = by.get("ingest", {}).get("runs", [])
    paced = [r for r in runs if r.get("rate", 0) > 0]
    return (paced, "rate") if paced else (runs, "concurrency")


def _ingest_x(ax: Axes, runs: list[dict[str, Any]], key: str) -> None:
    if key == "rate":
        ax.set_xlabel("offered load (jobs/s)")
        _log_if_wide(ax, [r["rate"] for r in runs], "x")
    else:
        _concurrency_axis(ax, [r["concurrency"] for r in runs], "client concurrency (flat out)")


def ingest_throughput(ax: Axes, by: Results) -> bool:
    runs, key = _ingest_runs(by)
    if not runs:
        return False
    for batch in sorted({r["batch"] for r in runs}, reverse=True):
        rs = sorted((r for r in runs if r["batch"] == batch), key=lambda r: r[key])
        xs, ys = [r[key] for r in rs], [r["accepted_per_second"] for r in rs]
        ax.plot(xs, ys, "o-", label=f"batch {batch}")
    values = [r["accepted_per_second"] for r in runs]
    if key == "rate":
        ends = [min(values + [r["rate"] for r in runs]), max(values + [r["rate"] for r in runs])]
        ax.plot(ends, ends, "--", color="0.5", zorder=1.5, label="accepted = offered")
        values += ends
    _log_if_wide(ax, values)
    _ingest_x(ax, runs, key)
    ax.set_ylabel("accepted (jobs/s)")
    ax.set_title("ingest throughput")
    return True


def ingest_latency(ax: Axes, by: Results) -> bool:
    runs, key = _ingest_runs(by)
    if not runs:
        return False
    batch = 100 if any(r["batch"] == 100 for r in runs) else max(r["batch"] for r in runs)
    rs = sorted((r for r in runs if r["batch"] == batch), key=lambda r: r[key])
    xs = [r[key] for r in rs]
    for q, style in (("p50", "o-"), ("p99", "s--")):
        ax.plot(xs, [r[f"latency_{q}"] * 1000 for r in rs], style, label=q)
    _log_if_wide(ax, [r[f"latency_{q}"] for r in rs for q in ("p50", "p99")])
    _ingest_x(ax, rs, key)
    ax.set_ylabel("request latency (ms)")
    ax.set_title(f"ingest request latency, batches of {batch}")
    return True


def burst_lag(ax: Axes, by: Results) -> bool:
    r = by.get("burst")
    if not r or not r.get("lag_series"):
        return False
    ts, lags = zip(*r["lag_series"], strict=True)
    ax.plot(ts, lags, ".-", label="consumer lag")
    ax.fill_between(ts, lags, alpha=0.15)
    ax.axvline(r["load"]["wall_seconds"], color="C3", ls="--", label="approx. end of burst")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter("{x:,.0f}")
    ax.set_xlabel("time since sampling started (s)")
    ax.set_ylabel("consumer lag (records)")
    ax.set_title(
        f"burst of {r['jobs']:,} jobs: peak lag {r['peak_lag']:,},"
        f" drained {r['drain_seconds_after_burst']:.1f} s after the burst"
    )
    return True


def engine_throughput(ax: Axes, by: Results) -> bool:
    # (inline steps?, engines) -> concurrency -> workflows/s
    lines: dict[tuple[bool, int], dict[int, float]] = {}
    for r in by.get("engine", {}).get("runs", []):
        if "concurrency" in r:  # older result files lack it
            key = ("inline" in r.get("workflow", ""), r["engines"])
            lines.setdefault(key, {})[r["concurrency"]] = r["workflows_per_second"]
    dbos_runs = by.get("dbos", {}).get("runs", [])
    for row in dbos_runs:  # its onceflow figure is a one-engine run (engine's own wins)
        lines.setdefault((False, 1), {}).setdefault(
            row["concurrency"], row["onceflow"]["workflows_per_second"]
        )
    if not lines:
        return False
    values: list[float] = []
    for (inline, engines), points in sorted(lines.items()):
        xs = sorted(points)
        values += [points[x] for x in xs]
        label = f"onceflow{', inline steps' if inline else ''}, {engines} engine" + (
            "s" if engines > 1 else ""
        )
        ax.plot(xs, [points[x] for x in xs], "o-", label=label)
    for label, name, marker in (
        ("dbos_default", "DBOS, 1 s poll", "s"),
        ("dbos_tuned", "DBOS, 0.05 s poll", "^"),
        ("dbos_start", "DBOS start_workflow (no queue)", "v"),
        ("dbos_direct", "DBOS direct call (no queue)", "D"),
    ):
        pts = [(row["concurrency"], row[label]) for row in dbos_runs if label in row]
        ys = [d.get("processing_workflows_per_second", d["workflows_per_second"]) for _, d in pts]
        if pts:
            ax.plot([c for c, _ in pts], ys, marker, ls="none", ms=8, label=name)
            values += ys
    _log_if_wide(ax, values)
    xs = [c for points in lines.values() for c in points] + [r["concurrency"] for r in dbos_runs]
    _concurrency_axis(ax, xs, "engine concurrency (workflows in flight per engine)")
    ax.set_ylabel("three-step workflows completed / s")
    ax.set_title("engine throughput (no-op steps)")
    return True


def latency_percentiles(ax: Axes, by: Results) -> bool:
    groups: list[tuple[str, float, float]] = []  # (label, p50 ms, p99 ms)
    e2e = by.get("e2e") or by.get("dbos", {}).get("onceflow_e2e")
    sources = [(f"light load, {e2e['rate']:.0f}/s", e2e["latency"])] if e2e else []
    if "latency" in by.get("burst", {}):  # older result files lack it
        sources.append(("burst", by["burst"]["latency"]))
    for name, lat in sources:
        for what, key in (("first step", "first_step"), ("complete", "complete")):
            groups.append((f"{name}\nsubmit →\n{what}", lat[f"{key}_p50_ms"], lat[f"{key}_p99_ms"]))
    for system in ("onceflow", "nobuffer") if "nobuffer" in by else ():
        load = by["nobuffer"][system]["load"]
        label = f"burst\nHTTP request\n{'no buffer' if system == 'nobuffer' else 'onceflow'}"
        groups.append((label, load["latency_p50"] * 1000, load["latency_p99"] * 1000))
    if not groups:
        return False
    xs = range(len(groups))
    for i, q in enumerate(("p50", "p99")):
        heights = [g[1 + i] for g in groups]
        bars = ax.bar([x + (i - 0.5) * 0.4 for x in xs], heights, 0.4, label=q)
        ax.bar_label(bars, fmt="{:,.0f}", fontsize=7, padding=1)
    ax.set_xticks(list(xs), [g[0] for g in groups], fontsize=7.5)
    ax.grid(False, axis="x")
    _log_if_wide(ax, [v for g in groups for v in g[1:]])
    ax.margins(y=0.12)
    ax.set_ylabel("latency (ms)")
    ax.set_title("latency percentiles")
    return True


class _Panel(NamedTuple):
    """One panel of the scaling plot: ``rate`` by ``x``, a line per labelled run list."""

    title: str
    xlabel: str
    ylabel: str
    cpu_label: str
    lines: list[tuple[str, list[dict[str, Any]]]]
    x: str
    rate: str


def _cpu_ms(row: dict[str, Any]) -> float:
    """CPU per job of a scale run: onceflow's processes plus PostgreSQL's backends."""
    return row.get("onceflow_cpu_ms_per_job", 0.0) + row.get("postgres_cpu_ms_per_job", 0.0)


def _scaling_panel(ax: Axes, panel: _Panel, pg_part: bool) -> None:
    """Rate by ``panel.x`` (solid, left axis) and CPU ms per job (dotted, right axis,
    same colour; with ``pg_part`` PostgreSQL's part dash-dotted). The right axis's
    styles get legend entries on the left axis, which holds the panel's legend."""
    from matplotlib.lines import Line2D

    cpu_ax = ax.twinx()
    for i, (label, rows) in enumerate(panel.lines):
        rows = sorted(rows, key=lambda r: r[panel.x])
        xs = [r[panel.x] for r in rows]
        ax.plot(xs, [r[panel.rate] for r in rows], "o-", color=f"C{i}", label=label)
        cpu_ax.plot(xs, [_cpu_ms(r) for r in rows], ".:", color=f"C{i}")
        if pg_part:
            pg = [r.get("postgres_cpu_ms_per_job", 0.0) for r in rows]
            cpu_ax.plot(xs, pg, "x-.", color=f"C{i}")
    proxies = [("CPU per job (right)", ":")] + [("PostgreSQL's part", "-.")] * pg_part
    for label, style in proxies:
        ax.add_line(Line2D([], [], color="0.35", ls=style, label=label))
    for axis in (ax, cpu_ax):  # room at the top for the legend
        axis.set_ylim(0, axis.get_ylim()[1] * 1.35)
    ax.yaxis.set_major_formatter("{x:,.0f}")
    cpu_ax.set_ylabel(panel.cpu_label, fontsize=8)
    ax.set_zorder(cpu_ax.get_zorder() + 1)  # the rates and the legend above the CPU lines
    ax.patch.set_visible(False)
    _concurrency_axis(ax, [row[panel.x] for _, rows in panel.lines for row in rows], panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    ax.set_title(panel.title, fontsize=10)
    ax.grid(True, alpha=0.4)


def _scaling_panels(r: dict[str, Any]) -> list[_Panel]:
    """The panels of a ``scale`` result that has runs for them."""
    queue = r.get("queue", [])
    ingest = r.get("ingest", [])
    conns = f", {ingest[0]['connections']} connections" if ingest else ""
    panels = [
        _Panel(
            f"ingest: single-job requests (wrk{conns})",
            "ingest processes (one port)",
            "requests / s",
            "CPU ms per request (ingest processes)",
            [("ingest", ingest)],
            "processes",
            "req_per_s",
        ),
        _Panel(
            "queue → instance",
            "streams worker processes",
            "instances created / s",
            "CPU ms per record (workers + PostgreSQL)",
            [
                (f"{p} partition{'s' * (p > 1)}", [q for q in queue if q["partitions"] == p])
                for p in sorted({q["partitions"] for q in queue})
            ],
            "workers",
            "records_per_second",
        ),
        _Panel(
            "engine: three-step no-op workflows",
            "engine processes",
            "workflows completed / s",
            "CPU ms per workflow (engines + PostgreSQL)",
            [("engine", r.get("engine", []))],
            "engines",
            "workflows_per_second",
        ),
    ]
    return [p for p in panels if any(rows for _, rows in p.lines)]


def scaling(ax: Axes, by: Results) -> bool:
    """``onceflow bench scale`` as up to three panels side by side (this plot widens its
    figure and takes ``ax`` as its first panel): ingest requests/s by ingest processes,
    instances/s by streams workers (a line per partition count), three-step workflows/s
    by engines; each with CPU per job on a second axis."""
    from matplotlib.figure import Figure

    panels = _scaling_panels(by.get("scale", {}))
    if not panels:
        return False
    fig = ax.get_figure()
    assert isinstance(fig, Figure)
    fig.set_size_inches(4.9 * len(panels), 4.5)
    grid = fig.add_gridspec(1, len(panels))
    ax.set_subplotspec(grid[0])
    for i, panel in enumerate(panels):
        panel_ax = ax if i == 0 else fig.add_subplot(grid[i])
        _scaling_panel(panel_ax, panel, pg_part=panel.x == "engines")
        if i:  # the first panel's legend is drawn by plot()
            panel_ax.legend(fontsize=8)
    return True


PLOTS: list[tuple[str, Callable[[Axes, Results], bool]]] = [
    ("ingest-throughput.png", ingest_throughput),
    ("ingest-latency.png", ingest_latency),
    ("burst-lag.png", burst_lag),
    ("engine-throughput.png", engine_throughput),
    ("latency-percentiles.png", latency_percentiles),
    ("scaling.png", scaling),
]


def plot(results: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Write a PNG per plot whose scenario is in ``results``; return their paths."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        msg = "matplotlib is not installed: pip install 'onceflow[bench]'"
        raise click.ClickException(msg) from exc
    by = {r["scenario"]: r for r in results}
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw in PLOTS:
        fig = Figure(figsize=(7, 4.5), dpi=120)
        FigureCanvasAgg(fig)
        ax = fig.subplots()
        ax.grid(True, alpha=0.4)
        if not draw(ax, by):
            continue
        ax.legend(fontsize=8)
        ax.title.set_fontsize(10)
        fig.text(0.99, 0.01, CAPTION, ha="right", va="bottom", fontsize=7, color="0.45")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        fig.savefig(out_dir / name)
        written.append(out_dir / name)
    return written


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), default="docs/bench", show_default=True)
def main(files: tuple[Path, ...], out: Path) -> None:
    """Plot the results of ``onceflow bench`` (several files are merged)."""
    for path in plot(load(list(files)), out):
        click.echo(path)


if __name__ == "__main__":
    main()
