"""Newer Slurm from Debian roots: 24.11 (trixie) and 26.05 (sid), run with chroot beside the
host's 22.05 (notes: slurm-versions.md). A root is built once with debootstrap, packed as a
zstd tarball named after the Slurm version it holds, and unpacked from that cache afterwards
(< a few seconds). Mounts: /proc and each cluster's base directory (bind, same path)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from babysitter.errors import BabysitterError

SUITES = {"24.11": "trixie", "26.05": "sid"}
PACKAGES = (
    "slurmctld,slurmd,slurm-client,munge,slurmrestd,slurm-wlm-jwt-plugin,"
    "slurm-wlm-basic-plugins,libslurm-dev,gcc,libc6-dev"
)
MIRROR = os.environ.get("BABYSITTER_DEBIAN_MIRROR", "http://deb.debian.org/debian")
CACHE = Path(os.environ.get("BABYSITTER_ROOTS_CACHE", "/var/cache/babysitter/roots"))
READY = ".babysitter-root-ready"


class RootError(BabysitterError):
    pass


def _run(argv: list[str], timeout: float, what: str) -> str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RootError(
            f"{what} took longer than {timeout:.0f} s (registry unreachable?)"
        ) from None
    except FileNotFoundError:
        raise RootError(f"{what}: {argv[0]} is not installed (make setup)") from None
    if r.returncode != 0:
        raise RootError(f"{what} failed: {(r.stderr or r.stdout).strip()[-400:]}")
    return r.stdout


def _finish(root: Path) -> None:
    """Make a fresh root usable: hosts, no service starts, the slurmrest user."""
    hostname = os.uname().nodename.split(".")[0]
    (root / "etc" / "hosts").write_text(f"127.0.0.1 localhost {hostname}\n")
    prc = root / "usr" / "sbin" / "policy-rc.d"
    prc.write_text("#!/bin/sh\nexit 101\n")
    prc.chmod(0o755)
    passwd = (root / "etc" / "passwd").read_text()
    if "slurmrest:" not in passwd:
        _run(
            ["chroot", str(root), "useradd", "-r", "-M", "-s", "/usr/sbin/nologin", "slurmrest"],
            60,
            "creating the slurmrest user",
        )
    (root / READY).write_text("ok\n")


def slurm_version_of(root: Path) -> str:
    out = _run(["chroot", str(root), "slurmctld", "-V"], 30, "reading the root's Slurm version")
    return out.strip().split()[-1]


@contextmanager
def machine_lock(path: Path) -> Iterator[None]:
    """One holder at a time per machine (a flock on `path`): two pytest-xdist workers (or two
    sessions) that need the same cold root or build would otherwise debootstrap or build into
    one directory, each deleting what the other downloads (a test run saw `Couldn't download
    .../Packages` that way)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_root(version: str, cache: Path = CACHE, debootstrap_timeout: float = 900) -> Path:
    """The unpacked root for a Slurm version, built or unpacked from the cache as needed."""
    if version not in SUITES:
        raise RootError(f"no Debian root for Slurm {version} (known: {', '.join(SUITES)})")
    suite = SUITES[version]
    root = cache / f"{suite}-root"
    if (root / READY).exists():
        return root
    with machine_lock(cache / f"{suite}.lock"):
        if (root / READY).exists():  # made by whoever held the lock
            return root
        return _make_root(suite, root, cache, debootstrap_timeout)


def _make_root(suite: str, root: Path, cache: Path, debootstrap_timeout: float) -> Path:
    tarballs = sorted(cache.glob(f"slurm-*-{suite}.tar.zst"))
    if tarballs:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir()
        _run(
            ["tar", "--zstd", "-xf", str(tarballs[-1]), "-C", str(root)],
            300,
            f"unpacking {tarballs[-1].name}",
        )
        (root / READY).write_text("ok\n")
        return root
    build = cache / f"{suite}-build"
    if not (build / "usr" / "sbin" / "slurmctld").exists():
        shutil.rmtree(build, ignore_errors=True)
        _run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={PACKAGES}",
                suite,
                str(build),
                MIRROR,
            ],
            debootstrap_timeout,
            f"debootstrap {suite} from {MIRROR} (cold cache at {cache})",
        )
    _finish(build)
    slurm = slurm_version_of(build)
    tarball = cache / f"slurm-{slurm}-{suite}.tar.zst"
    _run(
        ["tar", "--zstd", "-cf", str(tarball), "-C", str(build), "."],
        600,
        f"packing {tarball.name}",
    )
    build.rename(root)
    return root


def _mounted() -> set[str]:
    try:
        return {line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()}
    except OSError:
        return set()


def mount(root: Path, base: Path) -> None:
    """/proc (slurmctld needs it) and the cluster's base dir at the same path inside."""
    with machine_lock(_mounts_lock(root)):  # another cluster on this root may be unmounting
        _mount(root, base)


def _mounts_lock(root: Path) -> Path:
    return root.parent / f"{root.name}.mounts.lock"


def _mount(root: Path, base: Path) -> None:
    proc = root / "proc"
    if str(proc) not in _mounted():
        _run(["mount", "-t", "proc", "proc", str(proc)], 30, "mounting /proc in the root")
    inside = root / str(base).lstrip("/")
    inside.mkdir(parents=True, exist_ok=True)
    if str(inside) not in _mounted():
        _run(["mount", "--bind", str(base), str(inside)], 30, "bind-mounting the cluster dir")


def unmount(root: Path, base: Path) -> None:
    """Undo mount(); /proc goes when no other cluster still uses this root (checked under
    the lock mount() takes: a cluster coming up on another worker keeps its /proc)."""
    with machine_lock(_mounts_lock(root)):
        _unmount(root, base)


def _unmount(root: Path, base: Path) -> None:
    inside = root / str(base).lstrip("/")
    for target in (inside,):
        if str(target) in _mounted():
            r = subprocess.run(["umount", str(target)], capture_output=True, timeout=30)
            if r.returncode != 0:
                subprocess.run(["umount", "-l", str(target)], capture_output=True, timeout=30)
    prefix = str(root) + "/"
    others = [m for m in _mounted() if m.startswith(prefix) and m != str(root / "proc")]
    if not others and str(root / "proc") in _mounted():
        r = subprocess.run(["umount", str(root / "proc")], capture_output=True, timeout=30)
        if r.returncode != 0:
            subprocess.run(["umount", "-l", str(root / "proc")], capture_output=True, timeout=30)


def mounts_under(root: Path) -> list[str]:
    prefix = str(root) + "/"
    return sorted(m for m in _mounted() if m.startswith(prefix))


def write_wrappers(bin_dir: Path, root: Path) -> Path:
    """sinfo, squeue, scontrol, sbatch, scancel that run the root's own clients (a 22.05
    client cannot talk to a 24.11 controller)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for prog in ("sinfo", "squeue", "scontrol", "sbatch", "scancel", "srun", "sacct"):
        p = bin_dir / prog
        p.write_text(
            f'#!/bin/sh\n# Slurm client of {root}\nexec chroot "{root}" /usr/bin/{prog} "$@"\n'
        )
        p.chmod(0o755)
    return bin_dir


# A plain Debian 12 root (the packages' target: tests/test_package.py installs and purges them
# in a fresh copy of it each run): what a node has that the packages depend on (Python, procps's
# /bin/kill for the units' ExecReload) and systemd (systemctl enable, systemd-analyze).
PLAIN_SUITE = "bookworm"
PLAIN_PACKAGES = "python3,procps,systemd"


def plain_root_tarball(cache: Path = CACHE, debootstrap_timeout: float = 900) -> Path:
    """The cached tarball of a minimal Debian 12 root, debootstrapped once per machine."""
    tag = hashlib.sha256(PLAIN_PACKAGES.encode()).hexdigest()[:8]  # a new list: a new root
    tarball = cache / f"debian-{PLAIN_SUITE}-plain-{tag}.tar.zst"
    if tarball.exists():
        return tarball
    with machine_lock(cache / f"{PLAIN_SUITE}-plain.lock"):
        if tarball.exists():
            return tarball
        build = cache / f"{PLAIN_SUITE}-plain-build"
        shutil.rmtree(build, ignore_errors=True)
        _run(
            ["debootstrap", "--variant=minbase", f"--include={PLAIN_PACKAGES}", PLAIN_SUITE,
             str(build), MIRROR],
            debootstrap_timeout,
            f"debootstrap {PLAIN_SUITE} from {MIRROR} (cold cache at {cache})",
        )  # fmt: skip
        part = tarball.with_suffix(".part")
        _run(["tar", "--zstd", "-cf", str(part), "-C", str(build), "."], 600, f"packing {tarball}")
        part.rename(tarball)
        shutil.rmtree(build, ignore_errors=True)
        return tarball


def unpack(tarball: Path, dest: Path) -> Path:
    """A fresh copy of a cached root at `dest`."""
    dest.mkdir(parents=True)
    _run(["tar", "--zstd", "-xf", str(tarball), "-C", str(dest)], 300, f"unpacking {tarball}")
    return dest
