"""docs/deploy.md is executable: its `deploy:<step>` blocks become the scripts the docker test
cluster is built and set up with (docker/guide.py). These tests need no docker: the steps
exist, the docker files run them, every value they read is a documented site value the test
cluster provides, and each script passes shellcheck. tests/test_docker.py runs them for real."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from babysitter.devcluster import container

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
STEPS = {
    "site",
    "install",
    "plugin",
    "db",
    "controller",
    "node",
    "enforce",
    "verify-controller",
    "verify-node",
    "backup",
}
# given by the test cluster outside site.env: the image build, each node's container, the
# database role (docker/Dockerfile, docker/compose.yaml, docker/entrypoint.sh)
PROVIDED_ELSEWHERE = {"WHEEL", "NODE_NAME", "DB_PASSWORD"}


def _load_guide() -> ModuleType:
    spec = importlib.util.spec_from_file_location("babysitter_deploy_guide", DOCKER / "guide.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


guide = _load_guide()


def test_the_guide_has_every_step_in_order():
    assert set(guide.steps()) == STEPS
    order = [step for step, _, _ in guide.blocks(guide.GUIDE.read_text())]
    # an admin reads top to bottom: the database before the controller's migrations, the
    # controller (tokens) before the nodes, enforcing after the set-up
    first = {s: order.index(s) for s in STEPS}
    assert first["site"] < first["install"] < first["db"] < first["controller"] < first["node"]
    assert first["controller"] < first["enforce"]


def test_the_docker_cluster_runs_the_guides_steps():
    dockerfile = (DOCKER / "Dockerfile").read_text()
    entrypoint = (DOCKER / "entrypoint.sh").read_text()
    built = set(re.findall(r"/opt/babysitter-guide/([a-z-]+)\.sh", dockerfile))
    code = "\n".join(ln for ln in entrypoint.splitlines() if not ln.lstrip().startswith("#"))
    started = set(re.findall(r"\bguide ([a-z-]+)\b", code))
    assert built == {"install", "plugin"}
    assert started == {"db", "controller", "enforce", "node"}
    assert (built | started) <= set(guide.steps())
    # the units come from the guide's install, not from the docker files
    assert "babysitter agent" not in entrypoint and "babysitter controller" not in entrypoint
    assert "run_unit babysitter-agent" in entrypoint
    assert "run_unit babysitter-controller" in entrypoint


def test_every_value_a_step_reads_is_a_site_value_the_cluster_gives():
    scripts = guide.steps()
    site = scripts["site"]
    defined = set(re.findall(r"(?m)^([A-Z][A-Z0-9_]*)=", site))
    read = set().union(*(guide.variables(s) for name, s in scripts.items() if name != "site"))
    assert read, "no site values found: the variable scan is broken"
    assert read <= defined, f"not in the guide's site values: {sorted(read - defined)}"
    given = set(container.site_values()) | PROVIDED_ELSEWHERE
    assert defined <= given, f"the test cluster does not set {sorted(defined - given)}"
    entrypoint = (DOCKER / "entrypoint.sh").read_text()
    assert "export DB_PASSWORD" in entrypoint and "NODE_NAME=$NODE guide node" in entrypoint
    assert "WHEEL=$(ls /tmp/wheels/babysitter-*.whl)" in (DOCKER / "Dockerfile").read_text()


def test_the_steps_pass_shellcheck(tmp_path: Path):
    paths = guide.write(tmp_path)
    assert {p.stem for p in paths} == STEPS
    for path in paths:
        # the steps source /etc/default/babysitter on purpose (SC1091); the site values are
        # only set in their own step (SC2034)
        excluded = "SC1091,SC2034" if path.stem == "site" else "SC1091"
        r = subprocess.run(
            ["shellcheck", "-s", "bash", "-e", excluded, str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stdout


def test_the_files_the_install_step_takes_from_the_wheel_exist():
    from importlib.resources import files

    install = guide.steps()["install"]
    named = set(re.findall(r'"\$SHARE/([\w.-]+)"', install))
    assert {"babysitter-agent.service", "babysitter-healthcheck"} <= named
    shipped = {p.name for p in files("babysitter.systemd").iterdir()}
    assert named <= shipped, sorted(named - shipped)


def test_a_broken_block_is_an_error_naming_its_line():
    text = "intro\n\n```sh deploy:node\nbabysitter config check\n"
    with pytest.raises(guide.GuideError, match=r"deploy\.md:3: deploy:node block never ends"):
        guide.steps(text)
    with pytest.raises(guide.GuideError, match="empty"):
        guide.steps("```sh deploy:node\n\n```\n")


def test_a_step_stops_at_its_first_failing_command(tmp_path: Path):
    """The scripts run in strict mode: a failed command in the guide fails the image build
    or the container, never goes on half set up."""
    script = guide.steps("```sh deploy:x\nfalse\ntouch ran\n```\n")["x"]
    (tmp_path / "x.sh").write_text(script)
    r = subprocess.run(["bash", "x.sh"], cwd=tmp_path, timeout=30)
    assert r.returncode != 0 and not (tmp_path / "ran").exists()
