"""One engine's throughput and CPU, build against build, in interleaved runs.

``python -m onceflow_tools.engine_builds --before ccfa842 --pairs 3``: each run pre-fills
``--jobs`` three-step no-op workflows in a fresh database (``bench._stack`` and
``bench._prefill`` of the build under test) and runs one engine of that build at
``--concurrency``; builds strictly alternate (before, after, before, after ...) so a
noisy neighbour hits both. ``--before`` and ``--after`` are git revisions, checked out in
temporary worktrees (``--after`` defaults to this working tree, uncommitted changes
included); lifecycle events are off in every build that has them (builds before the
outbox had none), so the figures compare the engine's own work.

Per run it prints: workflows/s (first start to last finish, the database's clock), the
engine process's CPU per workflow split into its event-loop thread and the rest (step
and database threads), the CPU of the PostgreSQL backends of the run's database per
workflow (:class:`onceflow_tools.events_bench.DatabaseCpu`), the engine's cyclic
garbage collector (passes per generation and seconds, from ``gc.callbacks`` installed
by a ``sitecustomize`` on the engine's path), and the load average; then each pair's
after/before ratio. Each run is a child process importing the build under test, with
its working directory outside any checkout (``''`` first on ``sys.path`` would import
this tree instead).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import click

_HERE = Path(__file__).resolve().parents[2]

#: Installed in the engine (any process whose argv names the engine) of a run: sums the
#: collector's passes and time per generation and writes them at exit.
_SITECUSTOMIZE = """
import atexit, gc, json, os, sys, time
if os.environ.get("ONCEFLOW_GC_LOG") and "engine" in sys.argv:
    _n, _t, _at = [0, 0, 0], [0.0, 0.0, 0.0], [0.0]
    def _cb(phase, info):
        if phase == "start":
            _at[0] = time.perf_counter()
        else:
            _n[info["generation"]] += 1
            _t[info["generation"]] += time.perf_counter() - _at[0]
    gc.callbacks.append(_cb)
    def _dump():
        with open(os.environ["ONCEFLOW_GC_LOG"], "w") as f:
            json.dump({"passes": _n, "seconds": [round(t, 3) for t in _t]}, f)
    atexit.register(_dump)
"""

#: One run, in a child importing the build under test.
_RUN = """
import json, os, sys, tempfile, threading
from pathlib import Path
from onceflow.settings import Settings
from onceflow_tools import bench
from onceflow_tools.figures import run_span_seconds
sys.path.insert(0, os.environ["ONCEFLOW_BUILDS_TOOLS"])
from events_bench_cpu import DatabaseCpu, thread_cpu

workflow, concurrency, jobs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
stack = bench._stack(Settings(), Path(tempfile.mkdtemp()), f"builds{concurrency}", 4,
                     ONCEFLOW_ENGINE_CONCURRENCY=str(concurrency))
try:
    try:  # builds with lifecycle events: pre-fill without them too
        from workflow_engine.store import make_engine
        stack.db = make_engine(stack.settings.database_url, pool_size=2, lifecycle_events=False)
    except (TypeError, ImportError):
        pass
    bench._prefill(stack, jobs, workflow, "e")
    database = stack.settings.database_url.rsplit("/", 1)[1].split("?")[0]
    with DatabaseCpu(database) as pg:
        stack.start_engine("engine")
        pid = stack.group.procs["engine"].pid
        start = thread_cpu(pid)
        bench._wait_complete(stack, jobs, 600)
        end = thread_cpu(pid)
    span = max(run_span_seconds(stack.db), 1e-3)
    loop_ms = 1000 * (end[0] - start[0]) / jobs
    rest_ms = 1000 * (end[1] - start[1]) / jobs
    print("RESULT " + json.dumps({
        "wf_s": round(jobs / span), "loop_ms": round(loop_ms, 3), "threads_ms": round(rest_ms, 3),
        "pg_ms": round(1000 * pg.seconds() / jobs, 3), "load": round(os.getloadavg()[0], 2)}))
finally:
    stack.close()
"""

#: What the child needs of this tree, importable whatever the build under test has.
_CPU_HELPERS = '''
from __future__ import annotations
import os
from pathlib import Path
_TICKS = os.sysconf("SC_CLK_TCK")

def _cpu(stat):
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS

def thread_cpu(pid):
    """(the main thread's CPU seconds, every other thread's) of process ``pid``."""
    main = rest = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            seconds = _cpu((task / "stat").read_text())
        except OSError:
            continue
        if task.name == str(pid):
            main += seconds
        else:
            rest += seconds
    return main, rest
'''


def _worktree(rev: str, into: Path) -> Path:
    path = into / rev.replace("/", "_")
    subprocess.run(
        ["git", "-C", str(_HERE), "worktree", "add", "--detach", "-f", str(path), rev],
        check=True,
        capture_output=True,
    )
    return path


def _run_one(build: Path, helpers: Path, spec: tuple[str, int, int]) -> dict:
    gc_log = helpers / "gc.json"
    gc_log.unlink(missing_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(helpers / "site"), str(build), str(build / "examples"), str(build / "tools")]
        ),
        "ONCEFLOW_BUILDS_TOOLS": str(helpers),
        "ONCEFLOW_GC_LOG": str(gc_log),
        "ONCEFLOW_LIFECYCLE_EVENTS": "false",
    }
    out = subprocess.run(
        [sys.executable, "-c", _RUN, *map(str, spec)],
        cwd=helpers,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        raise click.ClickException(f"run of {build} failed:\n{out.stderr[-3000:]}")
    result = json.loads(lines[-1][len("RESULT ") :])
    if gc_log.exists():
        result["gc"] = json.loads(gc_log.read_text())
    return result


@click.command()
@click.option("--before", required=True, help="git revision of the reference build")
@click.option("--after", default=None, help="git revision (default: this working tree)")
@click.option("--workflow", "workflows", multiple=True, default=("noop-workflow",))
@click.option("--concurrency", default=64, show_default=True)
@click.option("--jobs", default=6000, show_default=True)
@click.option("--pairs", default=3, show_default=True)
def main(
    before: str,
    after: str | None,
    workflows: tuple[str, ...],
    concurrency: int,
    jobs: int,
    pairs: int,
) -> None:
    """Interleaved runs of one engine of two builds; prints each run and each pair's ratio."""
    with tempfile.TemporaryDirectory(prefix="onceflow-builds-") as tmp:
        helpers = Path(tmp)
        (helpers / "site").mkdir()
        (helpers / "site" / "sitecustomize.py").write_text(_SITECUSTOMIZE)
        (helpers / "events_bench_cpu.py").write_text(_CPU_HELPERS + _database_cpu_source())
        builds = {"before": _worktree(before, helpers), "after": _HERE}
        if after is not None:
            builds["after"] = _worktree(after, helpers)
        try:
            for workflow in workflows:
                for pair in range(1, pairs + 1):
                    got = {}
                    for name, path in builds.items():
                        got[name] = _run_one(path, helpers, (workflow, concurrency, jobs))
                        click.echo(f"{workflow} pair {pair} {name}: {json.dumps(got[name])}")
                    ratio = got["after"]["wf_s"] / max(got["before"]["wf_s"], 1)
                    click.echo(f"{workflow} pair {pair} after/before wf/s: {ratio:.2f}")
        finally:
            for path in builds.values():
                if path != _HERE:
                    subprocess.run(
                        ["git", "-C", str(_HERE), "worktree", "remove", "--force", str(path)],
                        capture_output=True,
                    )


def _database_cpu_source() -> str:
    """:class:`onceflow_tools.events_bench.DatabaseCpu`'s source, for the child (a build
    under test may be older than it)."""
    import inspect

    from onceflow_tools import events_bench

    return (
        "\nimport threading\n"
        + inspect.getsource(events_bench.DatabaseCpu).replace("_cpu_seconds(", "_pid_cpu(")
        + ('\n\ndef _pid_cpu(pid):\n    return _cpu(Path(f"/proc/{pid}/stat").read_text())\n')
    )


if __name__ == "__main__":
    main()
