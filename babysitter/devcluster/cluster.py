"""`DevCluster`: bring a real Slurm cluster up on this machine and take it down again.

Everything lives under `base`: config, munge key and socket, state, spools, logs, pid files,
fake GPU device nodes. Ports are chosen per base so several clusters run side by side. Every
daemon carries an environment marker so `down` finds exactly its own processes (and the
slurmstepds of its jobs), never anyone else's.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import shutil
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from babysitter.devcluster import config as conf
from babysitter.devcluster.install import SlurmInstall
from babysitter.devcluster.procs import (
    MARKER,
    alive,
    command_name,
    cwd_pids,
    marked_pids,
    read_pid,
    terminate,
    with_descendants,
)
from babysitter.errors import BabysitterError

log = logging.getLogger(__name__)

DEFAULT_BASE = Path("/tmp/babysitter-devcluster")
STATE_FILE = "cluster.json"


class DevClusterError(BabysitterError):
    pass


@dataclass
class ClusterInfo:
    base: str
    slurm_conf: str
    nodes: list[str]
    restd_socket: str
    ctld_port: int
    node_ports: list[int]
    munge_socket: str
    slurm_version: str
    name: str
    root: str | None = None
    bin: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    extra_nodes: int = 0  # configured nodes without a slurmd (fake00001..), State=DOWN

    @property
    def fake_nodes(self) -> list[str]:
        return conf.extra_node_names(self.extra_nodes)

    def env(self) -> dict[str, str]:
        """Environment for Slurm client commands against this cluster."""
        env = dict(os.environ)
        env["SLURM_CONF"] = self.slurm_conf
        if self.bin:
            env["PATH"] = f"{self.bin}:{env.get('PATH', '')}"
        return env

    def public(self) -> dict[str, Any]:
        d: dict[str, Any] = {"slurm_conf": self.slurm_conf, "base": self.base, "nodes": self.nodes}
        d["restd_socket"] = self.restd_socket
        d["slurm_version"] = self.slurm_version
        if self.bin:
            d["bin"] = self.bin
        if self.extra_nodes:
            d["extra_nodes"] = self.extra_nodes
            d["extra_node_range"] = [self.fake_nodes[0], self.fake_nodes[-1]]
        return d


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pick_ports(base: Path, count: int) -> list[int]:
    """A block of `count` free ports, starting from a spot derived from the base path."""
    h = int(hashlib.sha256(str(base.resolve()).encode()).hexdigest(), 16)
    start = 20000 + (h % 3000) * 10
    for attempt in range(200):
        first = start + attempt * 16
        if first + count >= 60000:
            first = 20000 + attempt
        ports = list(range(first, first + count))
        if all(_port_free(p) for p in ports):
            return ports
    raise DevClusterError("no free block of ports for the cluster")


class DevCluster:
    def __init__(
        self,
        base: Path | str = DEFAULT_BASE,
        nodes: int = 4,
        extra_conf: list[str] | None = None,
        install: SlurmInstall | None = None,
        restd: bool = True,
        slurm: str | None = None,
        extra_nodes: int = 0,
        topology_leafs: int = 0,
        reboot_hook: list[str] | None = None,
        resume_timeout_s: int = 120,
    ) -> None:
        self.base = Path(base).resolve()
        self.topology_leafs = topology_leafs
        # None: no RebootProgram (`scontrol reboot` cannot complete); a list: the simulated
        # power cycle runs `reboot_hook NODE` (devcluster/reboot.py), [] runs no hook
        self.reboot_hook = reboot_hook
        self.resume_timeout_s = resume_timeout_s
        self.n_nodes = nodes
        self.extra_nodes = extra_nodes
        self.extra_conf = list(extra_conf or [])
        if install is None and slurm is not None:
            host = SlurmInstall()
            if slurm != host.version_str:
                from babysitter.devcluster import source
                from babysitter.devcluster.roots import ensure_root

                if slurm in source.SOURCES:  # no Debian suite ships it: built from source
                    install = SlurmInstall(prefix=source.ensure_prefix(slurm))
                else:
                    install = SlurmInstall(ensure_root(slurm))
        self.install = install or SlurmInstall()
        # 26.05's slurmrestd refuses to run as root and a non-root one refuses root's
        # changes over the local socket (notes: slurm-versions.md): not started there
        self.restd = restd and self.install.version < (26, 0)
        self.info: ClusterInfo | None = None

    # ---- paths
    @property
    def marker(self) -> str:
        return str(self.base)

    def _p(self, *parts: str) -> Path:
        return self.base.joinpath(*parts)

    def _env(self, info: ClusterInfo) -> dict[str, str]:
        env = info.env()
        env[MARKER] = self.marker
        return env

    # ---- bring-up
    def up(self, timeout_s: float = 60.0) -> ClusterInfo:
        if self._p(STATE_FILE).exists():
            self.down()
        for d in ("etc", "state", "spool", "log", "run", "munge", "dev"):
            self._p(d).mkdir(parents=True, exist_ok=True)
        for stale in ("state", "spool"):
            shutil.rmtree(self._p(stale), ignore_errors=True)
            self._p(stale).mkdir()
        self._make_gpu_devices()
        bin_dir = None
        if self.install.root is not None:
            from babysitter.devcluster import roots

            roots.mount(self.install.root, self.base)
            bin_dir = str(roots.write_wrappers(self._p("bin"), self.install.root))
        elif self.install.prefix is not None:
            from babysitter.devcluster import source

            bin_dir = str(source.write_wrappers(self._p("bin"), self.install.prefix))
        # one more port for the slurmd-less nodes: nothing ever listens on it
        ports = _pick_ports(self.base, self.n_nodes + 1 + (1 if self.extra_nodes else 0))
        host = socket.gethostname().split(".")[0]
        name = "bs" + hashlib.sha1(str(self.base).encode()).hexdigest()[:8]
        spec = conf.ClusterSpec(
            name=name,
            base=self.base,
            controller_host=host,
            ctld_port=ports[0],
            node_names=[f"node{i}" for i in range(1, self.n_nodes + 1)],
            node_ports=ports[1 : self.n_nodes + 1],
            node_host=host,
            munge_socket=self._p("munge", "munge.socket"),
            slurm_version=self.install.version,
            extra_lines=self.extra_conf + self._source_conf_lines() + self._reboot_lines(),
            extra_nodes=self.extra_nodes,
            extra_port=ports[-1] if self.extra_nodes else None,
            topology_leafs=self.topology_leafs,
        )
        slurm_conf = conf.write_all(spec, self._plugin_lines())
        info = ClusterInfo(
            base=str(self.base),
            slurm_conf=str(slurm_conf),
            nodes=spec.node_names,
            restd_socket=str(self._restd_socket(name)),
            ctld_port=ports[0],
            node_ports=ports[1 : self.n_nodes + 1],
            munge_socket=str(spec.munge_socket),
            slurm_version=self.install.version_str,
            name=name,
            root=str(self.install.root) if self.install.root else None,
            bin=bin_dir,
            extra_nodes=self.extra_nodes,
        )
        self.info = info
        self._p(STATE_FILE).write_text(json.dumps(asdict(info), indent=2))
        try:
            self._start_munge(info)
            self.start_slurmctld()
            for node in info.nodes:
                self.start_slurmd(node)
            if self.restd:
                self._start_restd(info)
            self.wait_nodes_idle(info.nodes, timeout_s)
            if self.extra_nodes:
                self._resume_fake_nodes(info)
        except Exception:
            self.down()
            raise
        return info

    def _reboot_lines(self) -> list[str]:
        """RebootProgram (the simulated power cycle) and its plan, when a hook was given."""
        if self.reboot_hook is None:
            return []
        if self.install.root is not None:
            # a chrooted slurmd would run the program inside the Debian root, without this
            # Python: only the host's Slurm and a source build take a reboot hook
            raise DevClusterError("--reboot-hook needs the host's Slurm or a source build")
        from babysitter.devcluster import reboot

        etc = self._p("etc")
        etc.mkdir(parents=True, exist_ok=True)
        plan = {
            "marker": self.marker,
            "hook": self.reboot_hook,
            "pid_file": str(self._p("run", "slurmd-%n.pid")),
            "slurmd": self.install.argv(
                "slurmd", "-b", "-f", str(self._p("etc", "slurm.conf")), "-N", "%n"
            ),
        }
        (etc / reboot.PLAN).write_text(json.dumps(plan, indent=2))
        prog = etc / "reboot-program"
        prog.write_text(reboot.program_text(self.base))
        prog.chmod(0o755)
        return [f"RebootProgram={prog}", f"ResumeTimeout={self.resume_timeout_s}"]

    def _resume_fake_nodes(self, info: ClusterInfo) -> None:
        """DOWN -> IDLE (not responding) with no reason, in one scontrol call: a DOWN node is
        "drained for someone else" to babysitter's policy and would never be drained by it."""
        lo, hi = info.fake_nodes[0][4:], info.fake_nodes[-1][4:]
        r = subprocess.run(
            self.install.argv("scontrol", "update", f"NodeName=fake[{lo}-{hi}]", "State=RESUME"),
            env=info.env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        if r.returncode != 0:
            raise DevClusterError(f"cannot resume the fake nodes: {r.stderr.strip()[:300]}")

    def _plugin_lines(self) -> list[str]:
        # slurm_plugins/ (SPANK + job_submit.lua) are installed when their module is present
        try:
            plugins = importlib.import_module("babysitter.devcluster.plugins")
        except ImportError:
            return []
        lines: list[str] = plugins.configure(
            self.base, self._p("etc"), self.install.root, prefix=self.install.prefix
        )
        return lines

    def _make_gpu_devices(self) -> None:
        for i in range(conf.GPUS_PER_NODE):
            dev = self._p("dev", f"nvidia{i}")
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))  # char device like /dev/null

    def _run_daemon(self, argv: list[str], info: ClusterInfo, what: str) -> None:
        r = subprocess.run(
            argv,
            env=self._env(info),
            capture_output=True,
            text=True,
            timeout=30,
            cwd=str(self.base),
        )
        if r.returncode != 0:
            raise DevClusterError(
                f"{what} failed to start (exit {r.returncode}): "
                f"{(r.stderr or r.stdout).strip()[:500]}; logs in {self._p('log')}"
            )

    def _start_munge(self, info: ClusterInfo) -> None:
        key = self._p("munge", "munge.key")
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._p("munge").chmod(0o755)  # the socket directory must be world-executable
        self._run_daemon(
            self.install.argv(
                "munged",
                "--force",
                f"--socket={info.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={self._p('run', 'munged.pid')}",
                f"--log-file={self._p('log', 'munged.log')}",
                f"--seed-file={self._p('munge', 'munged.seed')}",
            ),
            info,
            "munged",
        )
        self._wait(lambda: Path(info.munge_socket).exists(), 10, "munged socket")

    def start_slurmctld(self) -> None:
        info = self._need_info()
        self._run_daemon(self.install.argv("slurmctld", "-f", info.slurm_conf), info, "slurmctld")
        self._wait(
            lambda: (p := read_pid(self._p("run", "slurmctld.pid"))) is not None and alive(p),
            10,
            "slurmctld pid",
        )

    def stop_slurmctld(self) -> None:
        pid = read_pid(self._p("run", "slurmctld.pid"))
        if pid:
            terminate([pid])

    def start_slurmd(self, node: str) -> None:
        info = self._need_info()
        self._p("spool", node).mkdir(parents=True, exist_ok=True)
        self._run_daemon(
            self.install.argv("slurmd", "-f", info.slurm_conf, "-N", node), info, f"slurmd {node}"
        )

    def kill_slurmd(self, node: str) -> None:
        """Simulate a dead node: SIGKILL its slurmd (its jobs' slurmstepds stay)."""
        pid = read_pid(self._p("run", f"slurmd-{node}.pid"))
        if pid and alive(pid):
            os.kill(pid, 9)
            terminate([pid], grace_s=1)

    # ---- Slurm built from source (25.11): slurmrestd as the slurm user with JWT (source.py)
    def _source_conf_lines(self) -> list[str]:
        if self.install.prefix is None or not self.restd:
            return []
        from babysitter.devcluster import source

        return source.jwt_conf_lines(self._p("etc"))

    def _restd_socket(self, name: str) -> Path:
        if self.install.prefix is None:
            return self._p("run", "slurmrestd.socket")
        from babysitter.devcluster import source

        return source.restd_socket(name)

    def _start_source_restd(self, info: ClusterInfo) -> None:
        from babysitter.devcluster import source

        token = source.write_root_token(
            self.install.argv("scontrol"), info.env(), self._p("etc", "jwt.token")
        )
        info.extra["jwt_token_file"] = str(token)
        self._p(STATE_FILE).write_text(json.dumps(asdict(info), indent=2))
        sock = Path(info.restd_socket)
        args, extra_env = source.prepare_restd(sock, Path(info.slurm_conf))
        env = {**self._env(info), **extra_env}
        argv = self.install.argv("slurmrestd", *args, "-s", "openapi/slurmctld", f"unix:{sock}")
        self._spawn_restd(argv, env, sock)

    def _spawn_restd(self, argv: list[str], env: dict[str, str], sock: Path) -> None:
        """Start slurmrestd (either build), record its pid and wait for its socket."""
        logf = open(self._p("log", "slurmrestd.log"), "ab")  # noqa: SIM115 - handed to child
        proc = subprocess.Popen(
            argv,
            env=env,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=str(self.base),
        )
        logf.close()
        self._p("run", "slurmrestd.pid").write_text(str(proc.pid))
        self._wait(sock.exists, 10, "slurmrestd socket")

    def _start_restd(self, info: ClusterInfo) -> None:
        if self.install.prefix is not None:
            self._start_source_restd(info)
            return
        sock = Path(info.restd_socket)
        sock.unlink(missing_ok=True)
        env = self._env(info)
        env["SLURMRESTD_SECURITY"] = "disable_user_check"
        argv = self.install.argv("slurmrestd", "-a", "rest_auth/local")
        # no slurmdbd: only the slurmctld plugins (the dbv ones would fail)
        argv += ["-s", "openapi/v0.0.38" if self.install.version < (23, 0) else "openapi/slurmctld"]
        argv.append(f"unix:{sock}")
        self._spawn_restd(argv, env, sock)

    # ---- state
    def _need_info(self) -> ClusterInfo:
        if self.info is None:
            self.info = self.load_info()
        return self.info

    def load_info(self) -> ClusterInfo:
        try:
            data = json.loads(self._p(STATE_FILE).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise DevClusterError(f"no devcluster at {self.base}") from exc
        return ClusterInfo(**data)

    def node_states(self, nodes: list[str] | None = None) -> dict[str, str]:
        """node -> sinfo compact state (idle, mix, drain, down*, ...); `nodes` limits the
        output (with 10,000 slurmd-less nodes the full table takes over a second)."""
        info = self._need_info()
        only = ["-n", ",".join(nodes)] if nodes else []
        r = subprocess.run(
            self.install.argv("sinfo", "-h", "-N", *only, "-o", "%N %t"),
            env=info.env(),
            capture_output=True,
            text=True,
            timeout=15,
        )
        states = {}
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    def wait_nodes_idle(self, nodes: list[str], timeout_s: float = 60.0) -> None:
        def ready() -> bool:
            st = self.node_states(nodes)
            return all(st.get(n) == "idle" for n in nodes)

        self._wait(ready, timeout_s, f"nodes {','.join(nodes)} idle")

    def _wait(self, cond: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if cond():
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            time.sleep(0.1)
        raise DevClusterError(
            f"timed out after {timeout_s:g} s waiting for {what}; logs in {self._p('log')}"
        )

    # ---- teardown
    def chroot(self) -> Path | None:
        """The Debian root this cluster runs from (also when only its base dir is known)."""
        if self.install.root is not None:
            return self.install.root
        if self._p(STATE_FILE).exists():
            try:
                stored = self.load_info().root
            except DevClusterError:
                return None
            return Path(stored) if stored else None
        return None

    def pids(self) -> list[int]:
        """Every live process of this cluster (daemons by pid file and marker, job steps)."""
        pids = set(marked_pids(self.marker))
        for pidfile in self._p("run").glob("*.pid") if self._p("run").exists() else []:
            p = read_pid(pidfile)
            if p and alive(p):
                pids.add(p)
        if self._p("spool").exists():
            pids.update(cwd_pids(self._p("spool")))
        if self._p("log").exists():
            # a source-built 25.11 slurmstepd runs in the slurmd log dir with a cleared env
            pids.update(cwd_pids(self._p("log")))
        root = self.chroot()
        if root is not None:
            # 24.11+ slurmstepd clears its environment and, daemonized, is no child of
            # slurmd: find it by its working directory inside the root's view of the base
            pids.update(cwd_pids(root / str(self.base).lstrip("/")))
        return sorted(p for p in with_descendants(pids) if alive(p))

    def down(self) -> None:
        """Stop everything this cluster started; fine when already down."""
        # slurmd/slurmctld first so they do not respawn steps, munged last
        tree = self.pids()  # includes running jobs' processes below slurmstepd
        order = ["slurmrestd.pid", "slurmctld.pid"]
        run = self._p("run")
        if run.exists():
            order += sorted(p.name for p in run.glob("slurmd-*.pid"))
            for name in order:
                p = read_pid(run / name)
                if p:
                    terminate([p], grace_s=3)
        rest = set(tree) | set(self.pids())
        # slurmstepd outwaits a SIGTERM (it waits for its job): its job's processes get the
        # SIGTERM and the grace, slurmstepd a SIGKILL after them instead of the whole grace
        stepds = {p for p in rest if command_name(p) == "slurmstepd"}
        left = terminate(rest - stepds, grace_s=3) + terminate(stepds, grace_s=0)
        munge = read_pid(run / "munged.pid") if run.exists() else None
        if munge:
            terminate([munge])
        left = [p for p in left if alive(p)]
        if left:
            raise DevClusterError(f"processes of {self.base} would not die: {left}")
        for pidfile in run.glob("*.pid") if run.exists() else []:
            pidfile.unlink(missing_ok=True)
        root = self.chroot()
        if root is not None:
            from babysitter.devcluster import roots

            roots.unmount(root, self.base)
        if self._p(STATE_FILE).exists():
            sock_dir = Path(self.load_info().restd_socket).parent
            if sock_dir.name.startswith("babysitter-restd-"):  # source build's, outside base
                shutil.rmtree(sock_dir, ignore_errors=True)
        self._p(STATE_FILE).unlink(missing_ok=True)

    def __enter__(self) -> ClusterInfo:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()
