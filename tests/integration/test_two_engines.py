"""Two engine processes against one database: every instance completes, nothing twice."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from onceflow_tools.processes import ProcessGroup, free_port
from tests.conftest import settings_env
from workflow_engine.model import Delivery
from workflow_engine.store.writes import create_instances


@pytest.mark.timeout(180)
def test_two_engines_1000_instances(settings, db, tmp_path, capsys):
    n = 1000
    with ProcessGroup(settings_env(settings), tmp_path / "logs") as group:
        for name in ("engine-a", "engine-b"):
            port = free_port()
            group.start(name, "engine", env={"ONCEFLOW_ENGINE_METRICS_PORT": str(port)})
            group.wait_http(f"http://127.0.0.1:{port}/metrics")
        started = time.monotonic()
        for start in range(0, n, 250):  # arrives in bursts, as from the streams worker
            create_instances(
                db,
                [
                    Delivery(
                        JobEnvelope(f"two_{i:04d}", "order-workflow", {"step_seconds": 0}),
                        "t",
                        0,
                        i,
                    )
                    for i in range(start, start + 250)
                ],
            )

        def done() -> int:
            with db.connect() as conn:
                return conn.execute(
                    sa.text("SELECT count(*) FROM onceflow_instances WHERE status = 'complete'")
                ).scalar()

        while done() < n:
            assert time.monotonic() - started < 150, f"only {done()} of {n} complete"
            group.check_alive()
            time.sleep(0.2)
        elapsed = time.monotonic() - started

    with db.connect() as conn:

        def q(sql):
            return conn.execute(sa.text(sql)).scalar()

        doubled_effects = q(
            "SELECT count(*) FROM (SELECT job_id, step FROM"
            " onceflow_demo_side_effects GROUP BY 1, 2 HAVING count(*) > 1) x"
        )
        doubled_attempts = q("SELECT count(*) FROM onceflow_step_attempts WHERE attempt > 1")
        checkpoints = q("SELECT count(*) FROM onceflow_steps WHERE status = 'complete'")
        effects = q("SELECT count(*) FROM onceflow_demo_side_effects")
        by_engine = conn.execute(
            sa.text("SELECT engine_id, count(*) FROM onceflow_step_attempts GROUP BY 1")
        ).all()
    with capsys.disabled():
        print(
            f"\ntwo engines: {n} instances, {checkpoints} checkpoints in {elapsed:.1f}s"
            f" ({n / elapsed:.0f} workflows/s); steps per engine:"
            f" {sorted(c for _, c in by_engine)}; doubled side effects: {doubled_effects},"
            f" repeated attempts: {doubled_attempts}"
        )
    assert checkpoints == 3 * n
    assert effects == 3 * n
    assert doubled_effects == 0
    assert doubled_attempts == 0
    assert len(by_engine) == 2 and all(c > 0 for _, c in by_engine)  # both did work
