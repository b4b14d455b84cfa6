"""systemd units and the HealthCheckProgram wrapper, checked with the real tools
(systemd-analyze from Debian's systemd, shellcheck)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SYSTEMD_DIR = Path(__file__).resolve().parents[1] / "systemd"
UNITS = sorted(SYSTEMD_DIR.glob("*.service"))
INSTALLED = Path("/usr/local/bin/babysitter")  # where the units expect the documented install


@pytest.fixture
def installed_babysitter() -> Iterator[None]:
    """The units name /usr/local/bin/babysitter (docs/deploy.md's install). systemd-analyze checks
    that the executable exists, so install this checkout's entry point there for the test when
    nothing is installed, and take it away afterwards."""
    created = False
    if not INSTALLED.exists():
        INSTALLED.parent.mkdir(parents=True, exist_ok=True)
        INSTALLED.symlink_to(Path(sys.executable).parent / "babysitter")
        created = True
    try:
        yield
    finally:
        if created:
            INSTALLED.unlink()


def test_units_exist():
    names = {u.name for u in UNITS}
    assert {"babysitter-agent.service", "babysitter-controller.service"} <= names


def test_systemd_analyze_verify_is_clean(installed_babysitter):
    r = subprocess.run(
        ["systemd-analyze", "verify", *map(str, UNITS)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    # warnings (unknown keys, bad sections) go to stderr with exit 0: treat them as failures
    assert r.stderr.strip() == "", r.stderr


@pytest.mark.parametrize("unit", ["babysitter-agent.service", "babysitter-controller.service"])
def test_units_are_notify_with_watchdog_and_hardening(unit):
    text = (SYSTEMD_DIR / unit).read_text()
    for line in (
        "Type=notify",
        "WatchdogSec=",
        "Restart=",
        "EnvironmentFile=",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=",
        "LimitNOFILE=",
    ):
        assert line in text, f"{unit} lacks {line}"


@pytest.mark.parametrize("unit", ["babysitter-agent.service", "babysitter-controller.service"])
def test_systemctl_reload_sends_sighup(unit):
    """`systemctl reload` re-reads the config without a restart (tests/test_reload.py: what a
    SIGHUP does to each daemon)."""
    text = (SYSTEMD_DIR / unit).read_text()
    assert "ExecReload=/bin/kill -HUP $MAINPID" in text.splitlines()


def test_agent_unit_keeps_gpu_devices_and_kmsg_reachable():
    text = (SYSTEMD_DIR / "babysitter-agent.service").read_text()
    assert "PrivateDevices=no" in text
    assert "CAP_SYSLOG" in text  # /dev/kmsg under dmesg_restrict
    assert "ProtectKernelLogs=yes" not in text  # that would hide /dev/kmsg


def test_healthcheck_wrapper_passes_shellcheck():
    r = subprocess.run(
        ["shellcheck", str(SYSTEMD_DIR / "babysitter-healthcheck")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def _fake_babysitter(tmp_path: Path, body: str) -> Path:
    """A stand-in for the babysitter binary, to exercise the wrapper's own logic."""
    p = tmp_path / "babysitter"
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)
    return p


def _run_wrapper(fake: Path, timeout: str = "30") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, BABYSITTER=str(fake), BABYSITTER_HEALTHCHECK_TIMEOUT=timeout)
    return subprocess.run(
        [str(SYSTEMD_DIR / "babysitter-healthcheck")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_healthcheck_wrapper_passes_args_and_exit_code(tmp_path):
    fake = _fake_babysitter(tmp_path, 'echo "$@"; exit 2')
    r = _run_wrapper(fake)
    assert r.returncode == 2
    assert r.stdout.strip() == "check --slurm-drain"


def test_healthcheck_wrapper_turns_a_hang_into_unknown(tmp_path):
    assert shutil.which("timeout")
    fake = _fake_babysitter(tmp_path, "sleep 30")
    r = _run_wrapper(fake, timeout="1")
    assert r.returncode == 3
    assert "did not finish" in r.stderr


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_every_command_a_unit_runs_is_one_the_cli_takes(unit: Path, tmp_path: Path):
    """ExecStartPre/ExecStart as written: `babysitter agent --config F` must parse (systemd
    would start a daemon that exits with a usage error at once, in a restart loop)."""
    lines = [
        ln.split("=", 1)[1]
        for ln in unit.read_text().splitlines()
        if ln.startswith(("ExecStart=", "ExecStartPre="))
    ]
    assert lines
    config = tmp_path / "babysitter.toml"
    config.write_text(f'[controller]\ndatabase_url = "sqlite:///{tmp_path}/b.db"\n')
    for line in lines:
        argv = line.split()
        assert argv[0] == str(INSTALLED)
        args = [str(config) if a == "/etc/babysitter/babysitter.toml" else a for a in argv[1:]]
        # --help after the options: click parses them all, then prints the help
        r = subprocess.run(
            [sys.executable, "-m", "babysitter.cli.main", *args, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, f"{line}: {r.stderr}"
    # and the migration the controller unit runs first reads that file
    if unit.name == "babysitter-controller.service":
        pre = next(
            ln.split("=", 1)[1] for ln in unit.read_text().splitlines() if "db upgrade" in ln
        )
        args = [str(config) if a.endswith(".toml") else a for a in pre.split()[1:]]
        subprocess.run(
            [sys.executable, "-m", "babysitter.cli.main", *args], check=True, timeout=120
        )
        assert (tmp_path / "b.db").exists()


AGENT_BUDGET_MB = 512  # the agent itself (~55 MB measured) with room to spare


def _memory_max_mb(unit: Path) -> float:
    """The unit's MemoryMax in MB (systemd's K/M/G/T suffixes are powers of 1024)."""
    (value,) = [
        line.split("=", 1)[1].strip()
        for line in unit.read_text().splitlines()
        if line.startswith("MemoryMax=")
    ]
    scale = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0**2}
    if value[-1] in scale:
        return float(value[:-1]) * scale[value[-1]]
    return float(value) / 1024**2  # bytes


def test_the_sdc_childs_own_memory_limit_acts_before_the_units_memory_max():
    """The SDC test runs in a child in the agent's cgroup: with MemoryMax=512M and the child's
    default max_rss_mb of 8192, the kernel OOM-killed every CUDA child (no reason recorded)
    long before babysitter's own limit (which says why) could act. The default limit plus the
    agent's own budget must fit under the unit's MemoryMax."""
    from babysitter.checks.sdc.settings import SdcCheckConfig

    max_rss_mb = SdcCheckConfig().max_rss_mb  # the default
    memory_max = _memory_max_mb(SYSTEMD_DIR / "babysitter-agent.service")
    assert max_rss_mb + AGENT_BUDGET_MB <= memory_max, (max_rss_mb, memory_max)
