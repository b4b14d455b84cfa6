"""`babysitter check --slurm-drain` when Slurm cannot be updated: Slurm discards the
HealthCheckProgram's stderr, so the failure must show in the exit code and in syslog."""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.gpu import babysitter_env, run_babysitter


@pytest.fixture
def syslog() -> Iterator[tuple[str, socket.socket]]:
    """A stand-in for /dev/log: a Unix datagram socket the test reads (short path: sun_path
    holds 108 bytes)."""
    with tempfile.TemporaryDirectory(prefix="bs-log-") as d:
        path = str(Path(d) / "log")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind(path)
        s.settimeout(10)
        try:
            yield path, s
        finally:
            s.close()


def no_slurm(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """Every Slurm command fails at once: there is none where the client looks."""
    (tmp_path / "no-slurm-bin").mkdir()
    return {**env, "BABYSITTER_SLURM__BIN_DIR": str(tmp_path / "no-slurm-bin")}


def test_a_failed_drain_exits_non_zero_and_is_logged_to_syslog(
    gpus, fakenvml_lib, tmp_path, syslog
):
    path, sock = syslog
    env = no_slurm(
        babysitter_env(
            gpus, fakenvml_lib, tmp_path, agent__node_name="node2", agent__syslog_socket=path
        ),
        tmp_path,
    )
    r = run_babysitter(env, "check", "--slurm-drain", "--only", "gpu")
    assert r.returncode == 3, r.stderr  # all checks clean, but the verdict never reached Slurm
    assert "could not update Slurm for node2" in r.stderr
    line = sock.recv(65536).decode()
    assert line.startswith("<27>babysitter-healthcheck: could not update Slurm for node2"), line


def test_without_a_syslog_socket_the_check_still_runs(gpus, fakenvml_lib, tmp_path):
    env = no_slurm(
        babysitter_env(gpus, fakenvml_lib, tmp_path, agent__syslog_socket=str(tmp_path / "absent")),
        tmp_path,
    )
    r = run_babysitter(env, "check", "--slurm-drain", "--only", "gpu")
    assert r.returncode == 3 and "could not update Slurm" in r.stderr
    assert "Traceback" not in r.stderr
