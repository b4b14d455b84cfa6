"""The docker test cluster's tool: its own dockerd, the image, compose up/down, fault injection.

    python3 docker/cluster.py daemon-up | daemon-down | image | up | down | inject NODE GPU XID

Used by the Makefile (docker-setup, docker-up, docker-down) and tests/test_docker.py.

- dockerd: unless DOCKER_HOST names another engine, our own daemon (data root, exec root, pid
  file and socket of its own, no bridge and no iptables rules: every container uses host
  networking), so it never clashes with a system Docker; `daemon-down` stops only what
  `daemon-up` started.
- image: the base is the Debian trixie root of babysitter/devcluster/roots.py (debootstrapped
  once, cached as a zstd tarball) fed to `docker import` (no registry is reachable); on top,
  docker/Dockerfile installs the project from its wheel by running docs/deploy.md's own steps
  (docker/guide.py writes them into the build context). Both are tagged by content hash (root
  tarball; wheel contents + docker files + the guide's steps + base), so a second run builds
  nothing.
- compose: Debian's docker-compose 1.29 (see docker/README.md for why not the Python SDK).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _p in (REPO, HERE):  # babysitter.devcluster.roots from this checkout; guide.py beside us
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import guide  # noqa: E402 - after the path it is found on

DATA_ROOT = Path(os.environ.get("BABYSITTER_DOCKER_DATA", "/var/lib/babysitter-docker"))
RUN_DIR = Path("/run/babysitter-docker")
PIDFILE = RUN_DIR / "dockerd.pid"
OUR_HOST = f"unix://{RUN_DIR}/docker.sock"
PROJECT = "babysitter"
COMPOSE_FILE = HERE / "compose.yaml"
IMAGE = "babysitter-testcluster"
BASE_IMAGE = "babysitter-base"
SLURM = "24.11"  # the Debian root (trixie) the image is built from
STATE_DIR = Path(os.environ.get("BABYSITTER_DOCKER_DIR", "/var/tmp/babysitter-docker"))
DOCKER_FILES = ("Dockerfile", "entrypoint.sh", "alertmanager.yml")
HOST_CA = Path(os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt")


class DockerError(RuntimeError):
    pass


def docker_host() -> str:
    return os.environ.get("DOCKER_HOST") or OUR_HOST


def env() -> dict[str, str]:
    # the classic builder: Debian's engine has no BuildKit front end without buildx
    return dict(os.environ, DOCKER_HOST=docker_host(), DOCKER_BUILDKIT="0")


def docker_bin() -> str:
    # Debian's client matches Debian's engine; any other client on PATH works too
    return "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"


def run(
    argv: Sequence[str], timeout: float = 120, check: bool = True, **kw: object
) -> subprocess.CompletedProcess[str]:
    kw.setdefault("env", env())
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]
    if check and r.returncode != 0:
        raise DockerError(f"{' '.join(argv[:4])} failed: {(r.stderr or r.stdout).strip()[-2000:]}")
    return r


def docker(*args: str, timeout: float = 120, check: bool = True) -> str:
    return run([docker_bin(), *args], timeout=timeout, check=check).stdout


# ---- the engine


def engine_ok() -> bool:
    try:
        return (
            run([docker_bin(), "info", "-f", "{{.Driver}}"], timeout=20, check=False).returncode
            == 0
        )
    except (subprocess.TimeoutExpired, FileNotFoundError):
        return False


def _our_pid() -> int | None:
    try:
        pid = int(PIDFILE.read_text().strip())
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    if state == "Z":  # exited; our child (the test started it) until reaped
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        return None
    return pid


def daemon_up(timeout_s: float = 60) -> bool:
    """Start our dockerd when no engine answers at docker_host(); True if this call started it."""
    if engine_ok():
        return False
    if os.environ.get("DOCKER_HOST") and os.environ["DOCKER_HOST"] != OUR_HOST:
        raise DockerError(f"no Docker engine answers at DOCKER_HOST={os.environ['DOCKER_HOST']}")
    if shutil.which("dockerd") is None:
        raise DockerError("dockerd is not installed (make setup installs docker.io)")
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    DATA_ROOT.mkdir(parents=True, exist_ok=True)
    log = open(DATA_ROOT / "dockerd.log", "ab")  # noqa: SIM115 - handed to the daemon
    subprocess.Popen(
        [
            "dockerd",
            f"--data-root={DATA_ROOT / 'data'}",
            f"--exec-root={RUN_DIR / 'exec'}",
            f"--pidfile={PIDFILE}",
            f"--host={OUR_HOST}",
            "--storage-driver=overlay2",
            "--bridge=none",  # host networking only: no docker0, no NAT rules
            "--iptables=false",
            "--ip-masq=false",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    log.close()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if engine_ok():
            return True
        time.sleep(0.3)
    raise DockerError(f"dockerd did not answer within {timeout_s:g} s; see {DATA_ROOT}/dockerd.log")


def daemon_down(timeout_s: float = 60) -> None:
    """Stop the dockerd daemon_up() started (it stops its containers first); nothing else."""
    pid = _our_pid()
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _our_pid() is not None:
            if time.monotonic() > deadline:
                raise DockerError(f"dockerd {pid} did not stop within {timeout_s:g} s")
            time.sleep(0.2)
    # dockerd 20.10 leaves its default network namespace mounted when it exits
    netns = str(RUN_DIR / "exec" / "netns" / "default")
    if netns in leftover_mounts():
        run(["umount", netns], timeout=30)
    left = leftover_mounts()
    if left:
        raise DockerError(f"mounts left behind by dockerd: {left}")


def leftover_mounts() -> list[str]:
    """Mounts under our data or exec root, except the two a running dockerd keeps for itself
    (its data root bound onto itself, its default network namespace)."""
    own = (
        {str(DATA_ROOT / "data"), str(RUN_DIR / "exec" / "netns" / "default")}
        if _our_pid()
        else set()
    )
    out = []
    for line in Path("/proc/mounts").read_text().splitlines():
        target = line.split()[1]
        if target.startswith((str(DATA_ROOT) + "/", str(RUN_DIR) + "/")) and target not in own:
            out.append(target)
    return out


# ---- images


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _has_image(ref: str) -> bool:
    return run([docker_bin(), "image", "inspect", ref], check=False).returncode == 0


def base_image() -> str:
    """The debootstrapped root (roots.py's cache) as an image. Imported from the cached
    tarball, not the unpacked root: running devclusters mount /proc and their base dirs there."""
    from babysitter.devcluster import roots

    roots.ensure_root(SLURM)
    suite = roots.SUITES[SLURM]
    tarball = sorted(roots.CACHE.glob(f"slurm-*-{suite}.tar.zst"))[-1]
    ref = f"{BASE_IMAGE}:{_sha256_file(tarball)[:16]}"
    if not _has_image(ref):
        with subprocess.Popen(["zstd", "-dc", str(tarball)], stdout=subprocess.PIPE) as unz:
            run([docker_bin(), "import", "-", ref], timeout=900, stdin=unz.stdout)
            if unz.wait() != 0:
                raise DockerError(f"unpacking {tarball} failed")
    return ref


def build_wheel(out: Path) -> Path:
    """The project's wheel, built from a clean copy (no stale build/ of the checkout)."""
    src = out / "src"
    shutil.copytree(
        REPO,
        src,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", ".make", "*.so"
        ),
    )
    wheels = out / "wheels"
    # pip's isolated build env: setuptools as pyproject.toml asks, not whatever the venv has
    run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(src)],
        timeout=600,
        env=dict(env(), SOURCE_DATE_EPOCH="315532800"),  # same bytes: docker reuses its layers
    )
    (whl,) = wheels.glob("babysitter-*.whl")
    return whl


def wheel_digest(whl: Path) -> str:
    """Hash of the wheel's contents (names and bytes), not of the zip: timestamps differ."""
    h = hashlib.sha256()
    with zipfile.ZipFile(whl) as z:
        for name in sorted(z.namelist()):
            h.update(name.encode() + b"\0" + z.read(name) + b"\0")
    return h.hexdigest()


def image() -> tuple[str, bool]:
    """Build (or find) the cluster image: its content-hash reference (also tagged :latest for
    compose) and whether this call built it."""
    base = base_image()
    with tempfile.TemporaryDirectory(prefix="babysitter-docker-") as tmp:
        ctx = Path(tmp)
        whl = build_wheel(ctx)
        h = hashlib.sha256(base.encode() + wheel_digest(whl).encode())
        for name in DOCKER_FILES:
            h.update((HERE / name).read_bytes())
        for step in guide.write(ctx / "guide"):  # the guide's steps the image build runs
            h.update(step.name.encode() + b"\0" + step.read_bytes())
        ref = f"{IMAGE}:{h.hexdigest()[:16]}"
        built = not _has_image(ref)
        if built:
            shutil.rmtree(ctx / "src")
            for name in DOCKER_FILES:
                shutil.copy2(HERE / name, ctx / name)
            shutil.copy(HOST_CA if HOST_CA.exists() else os.devnull, ctx / "host-ca.crt")
            run(
                [docker_bin(), "build", "-q", "--force-rm", "--network=host",
                 "--build-arg", f"BASE={base}",
                 "--label", f"org.babysitter.content={h.hexdigest()}", "-t", ref, str(ctx)],
                timeout=1800,
            )  # fmt: skip
    docker("tag", ref, f"{IMAGE}:latest")
    for old in docker("image", "ls", IMAGE, "--format", "{{.Repository}}:{{.Tag}}").split():
        if old not in (ref, f"{IMAGE}:latest"):  # earlier builds: their own layers only
            docker("rmi", old, check=False)
    return ref, built


# ---- compose


def compose(
    *args: str, timeout: float = 300, check: bool = True, image_ref: str | None = None
) -> subprocess.CompletedProcess[str]:
    e = env()
    e["BABYSITTER_DOCKER_DIR"] = str(STATE_DIR)
    if image_ref:
        e["BABYSITTER_IMAGE"] = image_ref
    r = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE_FILE), "-p", PROJECT, "--ansi", "never", *args],
        env=e,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and r.returncode != 0:
        raise DockerError(f"docker-compose {args[0]} failed: {(r.stderr or r.stdout)[-3000:]}")
    return r


def up(image_ref: str | None = None, services: Sequence[str] = ()) -> None:
    """The cluster (or some of its services), started in dependency order: compose waits for
    the health checks of what comes first."""
    ref = image_ref or image()[0]
    down()
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    compose("up", "-d", *services, timeout=600, image_ref=ref)


def logs(tail: int = 40) -> str:
    """The last lines of every container's output (for a failed test's report)."""
    return compose("logs", "--no-color", f"--tail={tail}", check=False).stdout


def service(name: str) -> str:
    """The container of a compose service (docker-compose 1.29 names)."""
    return f"{PROJECT}_{name}_1"


def containers() -> list[str]:
    """Every container of the project, running or not."""
    out = docker("ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}")
    return out.split()


def down() -> None:
    """Stop and remove every container and network of the project; fine when nothing runs."""
    compose("down", "--remove-orphans", "--volumes", "--timeout", "5", check=False)
    left = containers()
    if left:  # compose could not (e.g. it failed half-way through an up)
        docker("rm", "-f", "-v", *left, check=False)
    left = containers()
    if left:
        raise DockerError(f"containers left behind: {left}")


def inject(node: str, gpu: int, xid: int) -> None:
    """An XID event on one simulated GPU: the fake NVML's state file, written in the node's
    container (the agent there sees it through NVML's event API)."""
    code = (
        "import os; from pathlib import Path; from babysitter.devcluster.fakenvml import FakeGpus\n"
        "g = object.__new__(FakeGpus); g.path = Path(os.environ['FAKE_STATE']); g.events = []\n"
        "g.fields = dict(ln.split('=', 1) for ln in g.path.read_text().splitlines() if '=' in ln)\n"
        "g._seq = max([int(k[6:]) for k in g.fields if k.startswith('event.')], default=0)\n"
        f"g.xid({gpu}, {xid})\n"
    )  # keeps the node's other fake state; the event's number follows the last one
    docker(
        "exec", "-e", f"FAKE_STATE=/var/lib/babysitter/{node}/nvml-state", service(node),
        "python", "-c", code,
    )  # fmt: skip


def main(argv: list[str]) -> int:
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "daemon-up":
        started = daemon_up()
        print(f"dockerd {'started' if started else 'already running'} at {docker_host()}")
    elif cmd == "daemon-down":
        if engine_ok():
            down()
        daemon_down()
    elif cmd == "image":
        daemon_up()
        print(image()[0])
    elif cmd == "up":
        daemon_up()
        up()
        print(f"up; DOCKER_HOST={docker_host()} docker-compose -f {COMPOSE_FILE} -p {PROJECT} ps")
    elif cmd == "down":
        if engine_ok():
            down()
    elif cmd == "inject" and len(argv) == 5:
        inject(argv[2], int(argv[3]), int(argv[4]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
