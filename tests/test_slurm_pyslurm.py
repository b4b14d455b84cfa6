"""The optional pyslurm backend. pyslurm on PyPI is built only for Slurm 25.11, which no
registry reachable here ships, so it cannot run against a live Slurm on this machine. These
tests cover what can be covered: the clear error when pyslurm is absent, and the mapping of
pyslurm's record dicts through a stand-in module shaped like pyslurm 25.11's API
(`Nodes.load()`, `Jobs.load()` returning name/id -> object with `to_dict()`)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from babysitter.config import Config
from babysitter.slurm.client import SlurmError
from babysitter.slurm.factory import make_client
from babysitter.slurm.pyslurm import PyslurmSlurmClient


def test_without_pyslurm_the_backend_says_why_and_what_to_use():
    assert importlib.util.find_spec("pyslurm") is None, "pyslurm unexpectedly installed"
    cfg = Config.model_validate({"slurm": {"backend": "pyslurm"}})
    with pytest.raises(SlurmError, match=r"Slurm 25\.11.*'cli' or 'rest'"):
        make_client(cfg)


def test_cli_reports_missing_pyslurm_on_one_line(tmp_path):
    conf = tmp_path / "b.toml"
    conf.write_text("[slurm]\nbackend = 'pyslurm'\n")
    r = subprocess.run(
        [sys.executable, "-m", "babysitter.cli.main", "--config", str(conf), "slurm", "nodes"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert r.stderr.startswith("error: ") and "pyslurm" in r.stderr
    assert "Traceback" not in r.stderr


class _Rec:
    def __init__(self, d: dict) -> None:
        self._d = d

    def to_dict(self) -> dict:
        return dict(self._d)


class _StandInPyslurm:
    """Stand-in with pyslurm 25.11's record-loading shape (not the real library)."""

    class Nodes:
        @staticmethod
        def load() -> dict:
            return {
                "node1": _Rec({"state": "IDLE", "partitions": ["gpu"], "reason": None}),
                "node2": _Rec({"state": ["IDLE", "DRAIN"], "reason": "babysitter: x"}),
            }

    class Jobs:
        @staticmethod
        def load() -> dict:
            return {5: _Rec({"state": "RUNNING", "nodes": "node[1-2]", "requeue_count": 2})}


def test_records_map_to_the_common_model():
    c = PyslurmSlurmClient(module=_StandInPyslurm)
    nodes = {n.name: n for n in c.nodes()}
    assert nodes["node2"].drained_or_draining and c.owns(nodes["node2"])
    assert not nodes["node1"].drained_or_draining
    job = c.job(5)
    assert job.running and job.nodes == ("node1", "node2") and job.restart_count == 2
