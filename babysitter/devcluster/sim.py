"""A whole babysitter installation on one machine: a devcluster, the controller (SQLite or
Postgres) and one agent per Slurm node over simulated GPUs (fake NVML) and a kernel-log file.
The demo, the end-to-end tests and the fault->drain benchmark all use this."""

from __future__ import annotations

import os
import secrets as pysecrets
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from babysitter.controller.api.auth import node_token
from babysitter.devcluster import simib
from babysitter.devcluster.cluster import ClusterInfo, DevCluster
from babysitter.devcluster.fakenvml import FakeGpus, build
from babysitter.secretfile import write_private


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _toml(data: dict[str, dict[str, Any]]) -> str:
    def val(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'

    out = []
    for section, values in data.items():
        out.append(f"[{section}]")
        out += [f"{k} = {val(v)}" for k, v in values.items()]
        out.append("")
    return "\n".join(out)


def sim_validation(base: Path, extra: str = "") -> dict[str, Any]:
    """A [validation] section whose job runs the real `babysitter validate` on the node's
    simulated GPUs (numpy asked for explicitly: no GPU backend on a test machine; `auto` would
    rightly refuse). A CPU run passes only a node configured with no GPUs, so `--gpus 0` says
    so over the gres the controller passes (NVML is still watched on the fake GPUs). `extra`:
    shell words added to its command line (e.g. a fault injection)."""
    node_dir = Path(base).resolve() / "nodes" / "{node}"
    validate = [sys.executable, "-m", "babysitter.cli.main", "validate", "--json"]
    return {
        "command": [
            "sh",
            "-c",
            f"{extra}exec {shlex.join(validate)} --stress-s 0 --gpus 0 $extra",
        ],
        "output_dir": str(Path(base).resolve() / "validation"),
        "time_limit_min": 5,
        "sbatch_args": [
            f"--export=ALL,FAKE_NVML_STATE={node_dir}/nvml-state,LD_LIBRARY_PATH={build()},"
            f"BABYSITTER_AGENT__SPOOL_PATH={node_dir}/validate-state/spool.db,"
            "BABYSITTER_CHECKS__SDC__BACKEND=numpy,BABYSITTER_CHECKS__SDC__SIZE=256"
        ],
    }


def _spawn(
    command: str, config: Path, env: dict[str, str], log: Path, python: str | None = None
) -> subprocess.Popen[bytes]:
    """`babysitter <command>` with its own config file, logging to `log`. `python`: another
    installation's interpreter (another release: tests/test_version_skew.py), run from the
    config's folder so that no checkout on the way shadows its package."""
    with open(log, "ab") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            [python or sys.executable, "-m", "babysitter.cli.main", command],
            env=dict(os.environ, BABYSITTER_CONFIG=str(config), **env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=config.parent if python else None,
        )


def _stop(*procs: subprocess.Popen[bytes] | None, grace_s: float = 15) -> None:
    """SIGTERM to all at once (each takes most of a second to exit: one after the other, the
    agents of a small cluster took seconds), then SIGKILL to those not gone within grace_s."""
    live = [p for p in procs if p is not None and p.poll() is None]
    for p in live:
        p.terminate()
    deadline = time.monotonic() + grace_s
    for p in live:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


@dataclass
class SimNode:
    name: str
    gpus: FakeGpus
    kmsg: Path
    config: Path
    proc: subprocess.Popen[bytes] | None = None


@dataclass
class SimCluster:
    base: Path
    n_nodes: int = 4
    database_url: str | None = None
    webhook_url: str | None = None
    alertmanager_url: str | None = None
    policy: dict[str, Any] = field(default_factory=dict)
    validation: dict[str, Any] = field(default_factory=dict)  # the [validation] section
    controller_extra: dict[str, Any] = field(default_factory=dict)  # more [controller] keys
    agent_interval_s: float = 1.0
    check_interval_s: float | None = 1.0  # None: each check at its shipped interval
    extra_slurm_conf: list[str] = field(default_factory=list)
    ib_ports: int = 0  # simulated InfiniBand ports per node (0: no fabric)
    topology_leafs: int = 0  # >0: topology/tree over N leaf switches (devcluster --topology)
    extra_config: dict[str, dict[str, Any]] = field(default_factory=dict)  # more sections
    slurm_version: str | None = None  # 24.11 / 26.05 run from Debian roots, 25.11 from source
    slurm_backend: str = "cli"  # slurm.backend of the controller and agents
    # `scontrol reboot` works (RebootProgram = a simulated power cycle done by this object)
    reboot_hook: bool = False
    reboots: dict[str, int] = field(default_factory=dict)  # power cycles per node, by the hook
    reboot_times: list[tuple[str, float, float]] = field(default_factory=list)  # node, t0, t1
    gpu_resets: dict[str, int] = field(default_factory=dict)  # GPU resets per node, by the agent
    _watcher: threading.Thread | None = None
    _stop_watch: threading.Event = field(default_factory=threading.Event)
    env: dict[str, str] = field(default_factory=dict)  # BABYSITTER_* for every process
    # [checks.sdc] of the controller: None keeps the periodic SDC schedule off, so that tests
    # of other things do not find their nodes held for a test now and then (tests/test_sdc_e2e.py
    # runs it; the simulated GPUs need backend "numpy", which "auto" rightly refuses)
    sdc: dict[str, Any] | None = None
    # the interpreter of another installation (another release) for "controller" or a node's
    # agent; absent: this one
    python: dict[str, str] = field(default_factory=dict)
    # (role, config sections) -> the sections written for it: "controller" or a node's name;
    # e.g. what another release knows of them (tests/test_version_skew.py)
    adapt_config: Callable[[str, dict[str, dict[str, Any]]], dict[str, dict[str, Any]]] | None = (
        None
    )
    cluster: DevCluster | None = None
    info: ClusterInfo | None = None
    nodes: dict[str, SimNode] = field(default_factory=dict)
    controller: subprocess.Popen[bytes] | None = None
    url: str = ""

    def up(self) -> SimCluster:
        self.base = Path(self.base).resolve()
        self.base.mkdir(parents=True, exist_ok=True)
        self.cluster = DevCluster(
            self.base / "slurm",
            nodes=self.n_nodes,
            extra_conf=self.extra_slurm_conf,
            slurm=self.slurm_version,
            topology_leafs=self.topology_leafs,
            reboot_hook=(
                [sys.executable, "-m", "babysitter.devcluster.simreboot", str(self.reboot_dir)]
                if self.reboot_hook
                else None
            ),
        )
        self.info = self.cluster.up()
        etc = self.base / "etc"
        etc.mkdir(exist_ok=True)
        secret = etc / "cluster.secret"
        if not secret.exists():
            secret.write_text(pysecrets.token_hex(32))
            (etc / "admin.token").write_text(pysecrets.token_hex(16))
        if not (etc / "read.token").exists():
            (etc / "read.token").write_text(pysecrets.token_hex(16))
        for p in (secret, etc / "admin.token", etc / "read.token"):
            p.chmod(0o600)
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        try:
            self._start_controller(port)
            lib = build()
            for node in self.info.nodes:
                self._start_agent(node, lib)
            # power cycles (with a reboot hook) and GPU resets (the agents' reset command)
            self._stop_watch.clear()
            self._watcher = threading.Thread(
                target=self._watch_reboots, name="sim-reboots", daemon=True
            )
            self._watcher.start()
        except Exception:
            self.down()
            raise
        return self

    # ---- config generation (also what docker/ entrypoints use)
    def controller_config(self, port: int) -> dict[str, dict[str, Any]]:
        assert self.info is not None
        etc = self.base / "etc"
        alerts: dict[str, Any] = {}
        if self.webhook_url:
            alerts["webhook_url"] = self.webhook_url
        if self.alertmanager_url:
            alerts["alertmanager_url"] = self.alertmanager_url
        return {
            "controller": {
                "listen": f"127.0.0.1:{port}",
                "database_url": self.database_url or f"sqlite:///{self.base / 'babysitter.db'}",
                "cluster_secret_file": str(etc / "cluster.secret"),
                "admin_token_file": str(etc / "admin.token"),
                "read_token_file": str(etc / "read.token"),
                "loop_interval_s": 0.2,
                "heartbeat_timeout_s": 30,
                **self.controller_extra,
            },
            "slurm": self.slurm_section(),
            "policy": {"max_drained_fraction": 0.5, "resume_after_clean_checks": 2, **self.policy},
            "alerts": alerts,
            **({"validation": self.validation} if self.validation else {}),
            # RMA evidence archives of this cluster's lemons stay in its own directory
            "rma": {"archive_dir": str(self.base / "rma")},
            **self.extra_config,
            "checks.sdc": self.sdc if self.sdc is not None else {"enabled": False},
        }

    def agent_config(self, node: str) -> dict[str, dict[str, Any]]:
        assert self.info is not None
        d = self.base / "nodes" / node
        every = {} if self.check_interval_s is None else {"interval_s": self.check_interval_s}
        return {
            "agent": {
                "controller_url": self.url,
                "node_name": node,
                "kmsg_path": str(d / "kmsg"),
                "spool_path": str(d / "spool.db"),
                "token_file": str(d / "node.token"),
                "interval_s": self.agent_interval_s,
                "request_timeout_s": 2,
                "sysfs_root": str(d / "sysfs"),
                # a simulated reboot writes a new boot id: the agent forgets event findings
                "boot_id_path": str(d / "boot_id"),
                # the reset_gpu rung: this SimCluster heals the fake GPU (no nvidia-smi here)
                "gpu_reset_command": [
                    sys.executable,
                    "-m",
                    "babysitter.devcluster.simreboot",
                    "reset",
                    str(self.reboot_dir),
                    node,
                    "{index}",
                ],
            },
            "slurm": self.slurm_section(),
            # RMA evidence: the node's kernel log is its simulated kmsg (no bug report here)
            "rma": {"kernel_log_command": ["tail", "-n", "2000", str(d / "kmsg")]},
            "checks.gpu": {"expected_count": 8, **every},
            "checks.xid": every,
            "checks.host": {"check_slurmd": False, "min_free_gb": 0, "paths": [str(d)]},
            "checks.infiniband": {
                "expected_ports": self.ib_ports,
                **every,
            },
        }

    def _adapted(self, role: str, config: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return config if self.adapt_config is None else self.adapt_config(role, config)

    def slurm_section(self) -> dict[str, Any]:
        assert self.info is not None
        section: dict[str, Any] = {"slurm_conf": self.info.slurm_conf}
        if self.slurm_backend != "cli":
            section["backend"] = self.slurm_backend
        if self.slurm_backend == "rest":
            section["slurmrestd_url"] = f"unix://{self.info.restd_socket}"
            if self.info.extra.get("jwt_token_file"):
                section["jwt_token_file"] = self.info.extra["jwt_token_file"]
        if self.info.bin:
            section["bin_dir"] = self.info.bin
        return section

    def _start_controller(self, port: int) -> None:
        cfg = self.base / "etc" / "controller.toml"
        cfg.write_text(_toml(self._adapted("controller", self.controller_config(port))))
        self.controller = _spawn(
            "controller", cfg, self.env, self.base / "controller.log", self.python.get("controller")
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.controller.poll() is not None:
                raise RuntimeError(f"controller exited; see {self.base / 'controller.log'}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("controller did not become ready")

    def _start_agent(self, node: str, lib: Path) -> None:
        d = self.base / "nodes" / node
        d.mkdir(parents=True, exist_ok=True)
        secret = (self.base / "etc" / "cluster.secret").read_bytes().strip()
        write_private(d / "node.token", node_token(secret, node))
        kmsg = d / "kmsg"
        kmsg.touch()
        (d / "boot_id").write_text(str(uuid.uuid4()))
        cfg = d / "agent.toml"
        cfg.write_text(_toml(self._adapted(node, self.agent_config(node))))
        gpus = FakeGpus(d / "nvml-state", count=8, ident=len(self.nodes) + 1)
        if self.ib_ports:
            simib.make_tree(d / "sysfs", devices=self.ib_ports)
        sim = SimNode(node, gpus, kmsg, cfg)
        self.nodes[node] = sim
        self.start_agent(node, lib)

    def start_agent(
        self, node: str, lib: Path | None = None, env: dict[str, str] | None = None
    ) -> None:
        """Start (again) the agent of `node`; `env`: settings of this agent only."""
        sim = self.nodes[node]
        sim.proc = _spawn(
            "agent",
            sim.config,
            {**sim.gpus.env(lib or build()), **self.env, **(env or {})},
            sim.config.parent / "agent.log",
            self.python.get(node),
        )

    def restart_controller(self) -> None:
        """Stop the controller and start it again on the same port and database (with
        `python` as it is now: an upgrade, or a rollback)."""
        _stop(self.controller)
        self._start_controller(int(self.url.rpartition(":")[2]))

    def stop_agent(self, node: str) -> None:
        _stop(self.nodes[node].proc)

    def reboot(self, node: str) -> None:
        """A simulated reboot of a node: healthy GPUs, an empty kernel log, a fresh agent."""
        self.stop_agent(node)
        sim = self.nodes[node]
        sim.gpus.reset(8)
        sim.kmsg.write_text("")
        (sim.config.parent / "boot_id").write_text(str(uuid.uuid4()))
        if self.ib_ports:
            simib.make_tree(sim.config.parent / "sysfs", devices=self.ib_ports)
        self.start_agent(node)

    @property
    def reboot_dir(self) -> Path:
        return Path(self.base).resolve() / "reboots"

    def _watch_reboots(self) -> None:
        """Carry out the power cycles the RebootProgram asks for and the GPU resets the agents'
        reset command asks for (devcluster/simreboot.py)."""
        while not self._stop_watch.wait(0.1):
            for req in sorted(self.reboot_dir.glob("*.reset")):
                node, _, gpu = req.stem.rpartition(".gpu")
                if node in self.nodes:
                    self.nodes[node].gpus.reset_gpu(int(gpu))
                    self.gpu_resets[node] = self.gpu_resets.get(node, 0) + 1
                req.unlink(missing_ok=True)
            for req in sorted(self.reboot_dir.glob("*.req")):
                node = req.stem
                t0 = time.monotonic()
                if node in self.nodes:
                    self.reboot(node)
                    self.reboots[node] = self.reboots.get(node, 0) + 1
                self.reboot_times.append((node, t0, time.monotonic()))
                req.unlink(missing_ok=True)

    def inject_xid(
        self, node: str, gpu: int, xid: int, via: str = "nvml", text: str = "Channel exception"
    ) -> None:
        """An XID on one GPU: an NVML event, or (via="kmsg") a kernel-log line ending in
        `text` (XID 154's says which recovery action the driver now asks for)."""
        sim = self.nodes[node]
        if via == "nvml":
            sim.gpus.xid(gpu, xid)
        else:
            pci = {0: "18", 1: "2a", 2: "3a", 3: "5d", 4: "9a", 5: "ab", 6: "ba", 7: "db"}[gpu]
            with sim.kmsg.open("a") as f:
                f.write(f"NVRM: Xid (PCI:0000:{pci}:00): {xid}, pid=1234, name=python, {text}\n")

    def admin_token(self) -> str:
        return (self.base / "etc" / "admin.token").read_text().strip()

    def read_token(self) -> str:
        return (self.base / "etc" / "read.token").read_text().strip()

    def api(self, path: str) -> Any:
        r = httpx.get(
            self.url + path, timeout=5, headers={"Authorization": f"Bearer {self.admin_token()}"}
        )
        r.raise_for_status()
        return r.json()

    def down(self) -> None:
        self._stop_watch.set()
        if self._watcher is not None:
            self._watcher.join(timeout=30)
        _stop(*(n.proc for n in self.nodes.values()))
        _stop(self.controller)
        if self.cluster is not None:
            self.cluster.down()

    def cleanup(self) -> None:
        self.down()
        shutil.rmtree(self.base, ignore_errors=True)
