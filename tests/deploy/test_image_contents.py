"""The runtime distribution and the application image carry the product only.

No Docker engine runs here, so the image is checked from what builds it: the wheel of
the root distribution (what `pip install .` in the Dockerfile installs), its declared
dependencies without extras, and the Dockerfile's COPY lines and .dockerignore.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLING = ("bench", "benchplots", "chaos", "demo", "loadgen", "stack", "dashboard", "dev")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
        check=True,
        timeout=240,
    )
    (path,) = out.glob("onceflow-*.whl")
    return zipfile.ZipFile(path)


def test_wheel_holds_the_runtime_packages_and_no_tooling(wheel):
    names = wheel.namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("onceflow-")}
    assert tops == {
        "onceflow",
        "onceflow_cli",
        "producers",
        "streams",
        "workflow_engine",
        "console",
    }
    assert "console/static/vendor/htmx/htmx.min.js" in names  # no CDN: served by the process
    assert "console/static/vendor/htmx/LICENSE" in names  # htmx is 0BSD
    assert "console/templates/base.html" in names
    assert "workflow_engine/store/migrations/0001_initial.sql" in names
    assert "workflow_engine/store/schema.sql" in names
    assert "producers/third_party/swagger-ui/LICENSE" in names  # Swagger UI is Apache-2.0
    modules = {Path(n).stem for n in names if n.endswith(".py")}
    assert not modules & set(TOOLING), modules & set(TOOLING)
    assert not [n for n in names if "onceflow_examples" in n or "baselines" in n]


def test_runtime_dependencies_bring_no_tools(wheel):
    (meta_name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    meta = Parser().parsestr(wheel.read(meta_name).decode())
    plain = [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]
    names = {re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0].lower() for r in plain}
    assert names, "no runtime dependencies parsed"
    for unwanted in ("matplotlib", "schemathesis", "pytest", "onceflow-tools", "onceflow-examples"):
        assert unwanted not in names


def test_dockerfile_copies_no_tools_and_only_the_examples_target_has_samples():
    text = (ROOT / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    copied = {stage.split()[2]: re.findall(r"^COPY (\S+)", stage, flags=re.M) for stage in stages}
    assert set(copied) == {"base", "examples", "runtime"}
    assert copied["base"] == [
        "pyproject.toml",
        "onceflow",
        "onceflow_cli",
        "producers",
        "streams",
        "workflow_engine",
        "console",
    ]
    assert copied["examples"] == ["examples"]
    assert copied["runtime"] == []
    assert stages[-1].startswith("base AS runtime"), "the default target must be the runtime"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "tools" in ignored and "tests" in ignored
