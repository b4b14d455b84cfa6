"""`make package`: the .deb packages installed, run and purged in a fresh Debian 12 root (a
copy of a debootstrapped root, cached under /var/cache/babysitter/roots, entered with chroot),
as an admin's configuration management would; the .rpm packages hold the same files.

The root shares the host's network: the agent installed from the package reports to a real
controller started on the host."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from babysitter import __version__
from babysitter.config import as_dict, load_config, parse_config
from babysitter.config_docs import example
from babysitter.devcluster import roots
from tests.fixtures.controller import ControllerProcess, Secrets, controller_config, free_port

REPO = Path(__file__).resolve().parents[1]
NODE = "pkgnode1"
# what `dpkg --purge` keeps (docs/deploy.md, "Rollback and uninstall"): what the admin wrote
# into /etc/babysitter, and the controller's SQLite database
KEPT = {
    "etc/babysitter",
    "etc/babysitter/babysitter.toml",
    "etc/babysitter/node.token",
    "var/lib/babysitter",
    "var/lib/babysitter/babysitter.db",
}
# what dpkg, useradd and the shell change in any root whatever is installed
# the build (a venv, byte-code, six packages) and an install: minutes on a loaded 2-core machine
SLOW_TIMEOUT_S = 1500
CHURN = re.compile(r"^(proc|dev|tmp|run|var/lib/dpkg|var/log|var/cache|root)(/|$)|^etc/\w+-$")


def test_the_example_config_is_every_key_at_its_default():
    """/etc/babysitter/babysitter.toml.example: uncommenting every `#key = value` line gives
    exactly the defaults, and as it is shipped (all commented) it is valid too."""
    text = example()
    assert "[agent]" in text and "[checks.gpu.thresholds]" in text
    uncommented = re.sub(r"(?m)^#(\w+ = )", r"\1", text)
    assert uncommented != text
    defaults = as_dict(parse_config({}))
    assert as_dict(load_config_text(uncommented)) == defaults
    assert as_dict(load_config_text(text)) == defaults


def load_config_text(text: str):
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
        f.write(text)
        f.flush()
        return load_config(f.name)


@pytest.fixture(scope="module")
def built_packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`make package`'s build, into this run's own directories."""
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run(
        [sys.executable, str(REPO / "packaging" / "build.py"), "--out", str(out),
         "--work", str(out / "work")],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {p.name: p for p in out.iterdir() if p.suffix in (".deb", ".rpm")}


@pytest.fixture
def debian12(tmp_path: Path) -> Iterator[Path]:
    """A fresh Debian 12 root with /proc mounted, unmounted afterwards."""
    root = roots.unpack(roots.plain_root_tarball(), tmp_path / "root")
    subprocess.run(["mount", "-t", "proc", "proc", str(root / "proc")], check=True, timeout=30)
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root / "proc")], check=True, timeout=30)


def inside(root: Path, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["chroot", str(root), *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
    )


def tree(root: Path) -> set[str]:
    """Every path in the root but the churn (never walking into /proc)."""
    out = set()
    for top, dirs, files in os.walk(root):
        rel = os.path.relpath(top, root)
        for name in [*dirs]:
            path = os.path.normpath(os.path.join(rel, name))
            if CHURN.match(path):
                dirs.remove(name)
            else:
                out.add(path)
        out |= {p for f in files if not CHURN.match(p := os.path.normpath(os.path.join(rel, f)))}
    return out


@pytest.mark.timeout(SLOW_TIMEOUT_S)
def test_the_packages_install_run_against_a_controller_and_purge(
    built_packages: dict[str, Path], debian12: Path, tmp_path: Path
):
    root = debian12
    debs = sorted(n for n in built_packages if n.endswith(".deb"))
    assert {d.split("_")[0] for d in debs} == {
        "babysitter", "babysitter-agent", "babysitter-controller"
    }  # fmt: skip
    for d in debs:
        (root / "tmp" / d).write_bytes(built_packages[d].read_bytes())
    before = tree(root)

    # install: everything from the packages and the root's own python3, nothing from a network
    r = inside(root, "dpkg", "-i", *(f"/tmp/{d}" for d in debs))
    assert r.returncode == 0, r.stdout + r.stderr
    r = inside(root, "babysitter", "--version")
    assert r.returncode == 0 and __version__ in r.stdout, r.stdout + r.stderr
    r = inside(root, "babysitter", "--config", "/etc/babysitter/babysitter.toml.example",
               "config", "check")  # fmt: skip
    assert r.returncode == 0 and "configuration ok" in r.stdout, r.stdout + r.stderr
    assert inside(root, "getent", "passwd", "babysitter").returncode == 0
    units = [
        f"/usr/lib/systemd/system/babysitter-{role}.service" for role in ("agent", "controller")
    ]
    r = inside(root, "systemd-analyze", "verify", *units)
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr
    for role in ("agent", "controller"):
        # enabled for the next boot, which starts it only once the configuration exists
        wants = root / f"etc/systemd/system/multi-user.target.wants/babysitter-{role}.service"
        assert wants.is_symlink()
        text = (root / units[0].lstrip("/").replace("agent", role)).read_text()
        assert "ConditionPathExists=/etc/babysitter/babysitter.toml" in text
        assert "ExecStart=/opt/babysitter/bin/babysitter " in text
    r = inside(root, "sh", "-n", "/usr/sbin/babysitter-build-spank")
    assert (
        r.returncode == 0 and (root / "usr/share/babysitter/slurm-plugins/babysit_spank.c").exists()
    )

    # the agent of the package reports to a controller on the host
    secrets = Secrets(tmp_path / "secrets")
    port = free_port()
    ctl = ControllerProcess(
        controller_config(secrets, f"sqlite:///{tmp_path / 'ctl.db'}", port=port),
        log=tmp_path / "controller.log",
    )
    etc = root / "etc" / "babysitter"
    (etc / "node.token").write_text(secrets.node(NODE))
    (etc / "node.token").chmod(0o600)
    (etc / "babysitter.toml").write_text(
        f'[agent]\ncontroller_url = "http://127.0.0.1:{port}"\nnode_name = "{NODE}"\n'
        'interval_s = 1\nenabled_checks = ["host.resources"]\n'
        "[checks.host]\ncheck_slurmd = false\nmin_free_gb = 0\n"
    )
    r = inside(root, "babysitter", "config", "check")
    assert r.returncode == 0, r.stderr
    # the controller's migrations from the package: the SQLite database purge keeps
    r = inside(root, "babysitter", "db", "upgrade")
    assert r.returncode == 0 and (root / "var/lib/babysitter/babysitter.db").exists(), r.stderr
    ctl.start(timeout=120)
    agent_log = tmp_path / "agent.log"
    with agent_log.open("wb") as log:
        agent = subprocess.Popen(
            ["chroot", str(root), "/usr/bin/babysitter", "agent"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
        )
    try:
        nodes: list[dict] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(n["name"] == NODE for n in nodes):
            assert agent.poll() is None, agent_log.read_text()
            try:
                nodes = httpx.get(
                    f"{ctl.url}/api/v1/nodes",
                    headers={"Authorization": f"Bearer {secrets.admin}"},
                    timeout=5,
                ).json()
            except httpx.HTTPError:
                nodes = []
            time.sleep(0.5)
        assert any(n["name"] == NODE for n in nodes), agent_log.read_text()
    finally:
        agent.terminate()
        agent.wait(timeout=60)
        ctl.stop()
    assert (root / "var/lib/babysitter/spool.db").exists()

    # an upgrade (the same packages again) keeps the directories as the admin tightened them,
    # and a unit the admin disabled (a node out of the roll-out) disabled
    inside(root, "chgrp", "babysitter", "/etc/babysitter")
    assert inside(root, "systemctl", "disable", "babysitter-agent.service").returncode == 0
    agent_wants = root / "etc/systemd/system/multi-user.target.wants/babysitter-agent.service"
    assert not agent_wants.is_symlink()
    (etc).chmod(0o750)
    (root / "var/lib/babysitter").chmod(0o700)
    r = inside(root, "dpkg", "-i", *(f"/tmp/{d}" for d in debs))
    assert r.returncode == 0, r.stdout + r.stderr
    assert oct(etc.stat().st_mode & 0o777) == oct(0o750)
    assert oct((root / "var/lib/babysitter").stat().st_mode & 0o777) == oct(0o700)
    assert not agent_wants.is_symlink()

    # purge: nothing left but what the admin must keep
    r = inside(root, "dpkg", "--purge", "babysitter-agent", "babysitter-controller", "babysitter")
    assert r.returncode == 0, r.stdout + r.stderr
    assert inside(root, "getent", "passwd", "babysitter").returncode != 0
    assert inside(root, "getent", "group", "babysitter").returncode != 0
    after = tree(root)
    assert after - before == KEPT, sorted((after - before) ^ KEPT)
    assert before - after == set(), sorted(before - after)  # nothing of the system's


@pytest.mark.timeout(SLOW_TIMEOUT_S)
def test_the_rpms_hold_the_debs_files(built_packages: dict[str, Path]):
    rpms = sorted(p for n, p in built_packages.items() if n.endswith(".rpm"))
    assert len(rpms) == 3, (
        f"no .rpm built (rpmbuild: apt-get install rpm): {sorted(built_packages)}"
    )
    rpm_paths = set(
        subprocess.run(
            ["rpm", "-qpl", *map(str, rpms)], capture_output=True, text=True, timeout=300,
            check=True,
        ).stdout.splitlines()  # a few paths hold spaces
    )  # fmt: skip
    deb_files, deb_all = set(), set()
    for name, path in built_packages.items():
        if not name.endswith(".deb"):
            continue
        listing = subprocess.run(
            ["dpkg-deb", "-c", str(path)], capture_output=True, text=True, timeout=300, check=True
        ).stdout
        for line in listing.splitlines():
            entry = line.split(None, 5)[5].split(" -> ")[0].removeprefix(".").rstrip("/")
            deb_all.add(entry)
            if not line.startswith("d"):
                deb_files.add(entry)
    assert deb_files <= rpm_paths, sorted(deb_files - rpm_paths)[:20]
    assert rpm_paths <= deb_all, sorted(rpm_paths - deb_all)[:20]
