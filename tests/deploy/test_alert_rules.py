"""The alert rules fire on what they are for: ``promtool test rules`` with series made up
in tests/deploy/alert_rules_test.yml (``promtool check rules`` only checks they load)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_alert_rules_fire_on_their_series():
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run `make tools` (Debian package prometheus)"
    result = subprocess.run(
        [promtool, "test", "rules", str(HERE / "alert_rules_test.yml")],
        capture_output=True,
        text=True,
        check=False,
        cwd=HERE,
    )
    assert result.returncode == 0, result.stdout + result.stderr
