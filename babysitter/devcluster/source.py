"""Slurm built from source, for versions no Debian suite ships: 25.11, the one PyPI's pyslurm
builds against (notes: slurm-25.11-pyslurm.md). The source tarball is a build input like a
Debian package, found next to the repository (`../shared/vendor`) or where
BABYSITTER_SLURM_SOURCE points; it is never copied into the repository.

Slurm is built once per machine into `<roots cache>/slurm-<version>-<sha256[:12]>` (configure
--prefix is that directory, so the binaries find their plugins and libraries there) and reused
while the marker file is there. pyslurm is built once against that prefix as a wheel, cached
beside it, and installed into a venv when missing.

    python -m babysitter.devcluster.source [--pyslurm]   # what `make setup` runs
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from babysitter.devcluster.roots import CACHE, RootError, machine_lock

REPO = Path(__file__).resolve().parents[2]
ENV_SOURCE = "BABYSITTER_SLURM_SOURCE"  # the tarball, or the directory holding it
READY = ".babysitter-prefix-ready"
PYSLURM_VERSION = "25.11.2"


@dataclass(frozen=True)
class Source:
    version: str  # full Slurm version
    tarball: str
    sha256: str


SOURCES = {
    # `git archive` of SchedMD's tag slurm-25-11-7-1 (GPL-2); same as the public 25.11.7 release
    "25.11": Source(
        "25.11.7",
        "slurm-25.11.7.tar.gz",
        "4f4358c6bad0059f496df2e3f13badd0f2f3aaab5545e2e7904072c3339aa777",
    ),
}


class SourceError(RootError):
    pass


def _main_checkout() -> Path:
    """The main checkout when REPO is a git worktree (its .git is a `gitdir:` file)."""
    git = REPO / ".git"
    if git.is_file():
        text = git.read_text().strip()
        if text.startswith("gitdir:"):
            gitdir = Path(text.split(":", 1)[1].strip())
            if gitdir.parent.name == "worktrees":
                return gitdir.parents[2]
    return REPO


def source_dirs() -> list[Path]:
    """Where the tarball is looked for, in order (env first)."""
    env = os.environ.get(ENV_SOURCE)
    if env:  # an explicit place is the only place
        p = Path(env)
        return [p.parent if p.suffix == ".gz" else p]
    dirs = [REPO.parent / "shared" / "vendor"]
    main = _main_checkout()
    if main != REPO:
        dirs.append(main.parent / "shared" / "vendor")
    return dirs


def find_tarball(src: Source) -> Path:
    env = os.environ.get(ENV_SOURCE)
    if env and Path(env).is_file():
        return Path(env)
    for d in source_dirs():
        if (d / src.tarball).is_file():
            return d / src.tarball
    raise SourceError(
        f"Slurm {src.version} source not found: put {src.tarball} (SchedMD's release, "
        f"sha256 {src.sha256[:12]}...) in {source_dirs()[0]} or set {ENV_SOURCE}=<its path>"
    )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def prefix_for(version: str, cache: Path = CACHE) -> Path:
    src = SOURCES[version]
    return cache / f"slurm-{src.version}-{src.sha256[:12]}"


def is_built(version: str, cache: Path = CACHE) -> bool:
    return (prefix_for(version, cache) / READY).exists()


def _build_step(argv: list[str], cwd: Path, log: Path, timeout: float, what: str) -> None:
    with log.open("ab") as out:
        try:
            r = subprocess.run(
                ["nice", "-n", "10", *argv],
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise SourceError(f"{what} took longer than {timeout:.0f} s; log: {log}") from None
    if r.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise SourceError(f"{what} failed (exit {r.returncode}): {' | '.join(tail)}; log: {log}")


def ensure_prefix(version: str, cache: Path = CACHE) -> Path:
    """The installed prefix of Slurm `version`, built from the source tarball when missing
    (about 3 minutes on 2 cores; the build deps come from `make setup`)."""
    if version not in SOURCES:
        raise SourceError(f"no Slurm source for {version} (known: {', '.join(SOURCES)})")
    src = SOURCES[version]
    prefix = prefix_for(version, cache)
    if (prefix / READY).exists():
        return prefix
    tarball = find_tarball(src)
    with machine_lock(cache / f"{prefix.name}.lock"):
        if (prefix / READY).exists():  # built by whoever held the lock
            return prefix
        digest = _sha256(tarball)
        if digest != src.sha256:
            raise SourceError(f"{tarball}: sha256 {digest[:12]}..., expected {src.sha256[:12]}...")
        build = cache / f"{prefix.name}-build"
        shutil.rmtree(build, ignore_errors=True)
        shutil.rmtree(prefix, ignore_errors=True)
        build.mkdir(parents=True)
        log = cache / f"{prefix.name}-build.log"
        log.write_text("")
        with tarfile.open(tarball) as tf:
            tf.extractall(build, filter="tar")
        top = build if (build / "configure").exists() else next(build.iterdir())
        jobs = str(os.cpu_count() or 1)
        _build_step(
            [
                "./configure",
                f"--prefix={prefix}",
                f"--sysconfdir={prefix}/etc",
                "--disable-debug",
                # `slurmd -N nodeX`, several per host (Debian builds it this way too)
                "--enable-multiple-slurmd",
            ],
            top,
            log,
            600,
            f"configure Slurm {src.version} (build deps: make setup)",
        )
        _build_step(["make", f"-j{jobs}"], top, log, 3600, f"building Slurm {src.version}")
        _build_step(["make", "install"], top, log, 600, f"installing Slurm {src.version}")
        (prefix / READY).write_text(f"{src.sha256}\n")
        shutil.rmtree(build, ignore_errors=True)
    return prefix


def write_wrappers(bin_dir: Path, prefix: Path) -> Path:
    """sinfo, squeue, ... of the prefix in the cluster's bin dir (the host's 22.05 clients on
    PATH cannot talk to a 25.11 controller)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for prog in ("sinfo", "squeue", "scontrol", "sbatch", "scancel", "srun", "sacct"):
        p = bin_dir / prog
        p.write_text(f'#!/bin/sh\n# Slurm client of {prefix}\nexec "{prefix}/bin/{prog}" "$@"\n')
        p.chmod(0o755)
    return bin_dir


# ---- slurmrestd of a source build. Built with --disable-debug (NDEBUG), 25.11's slurmrestd
# aborts on SLURMRESTD_SECURITY=disable_user_check and refuses to run as root or SlurmUser
# (root here). So it runs as the `slurm` user (Debian's slurmctld package makes it), and, as
# a non-root slurmrestd turns a root caller of the local socket into "Invalid user id", callers
# authenticate with a JWT (slurm.conf AuthAltTypes=auth/jwt).
RESTD_USER = "slurm"


def jwt_conf_lines(etc: Path) -> list[str]:
    key = etc / "jwt.key"
    if not key.exists():
        etc.mkdir(parents=True, exist_ok=True)
        key.write_bytes(os.urandom(32).hex().encode())
    key.chmod(0o600)
    return ["AuthAltTypes=auth/jwt", f"AuthAltParameters=jwt_key={key}"]


def restd_socket(cluster_name: str) -> Path:
    """Outside the base dir: a test's base sits below 0700 directories the restd user cannot
    traverse, and slurmrestd binds after dropping root."""
    return Path("/tmp") / f"babysitter-restd-{cluster_name}" / "slurmrestd.socket"


def prepare_restd(sock: Path, slurm_conf: Path) -> tuple[list[str], dict[str, str]]:
    """The socket dir owned by the restd user, with a copy of slurm.conf it can read (it reads
    the config after dropping root); (extra argv, extra env) for slurmrestd."""
    import pwd

    try:
        pw = pwd.getpwnam(RESTD_USER)
    except KeyError:
        raise SourceError(
            f"slurmrestd of a source-built Slurm runs as user {RESTD_USER!r}, which does not "
            "exist (Debian's slurmctld package creates it: make setup)"
        ) from None
    sock.parent.mkdir(mode=0o755, exist_ok=True)
    os.chown(sock.parent, pw.pw_uid, pw.pw_gid)
    sock.unlink(missing_ok=True)
    conf = sock.parent / "slurm.conf"
    shutil.copy(slurm_conf, conf)
    conf.chmod(0o644)
    env = {"SLURM_JWT": "daemon", "SLURM_CONF": str(conf)}
    return ["-u", RESTD_USER, "-g", RESTD_USER, "-a", "rest_auth/jwt"], env


def write_root_token(scontrol: list[str], env: dict[str, str], out: Path) -> Path:
    """A long-lived JWT for root (what the REST backend sends), written 0600."""
    r = subprocess.run(
        [*scontrol, "token", "username=root", f"lifespan={365 * 86400}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if r.returncode != 0:
        raise SourceError(f"scontrol token failed: {(r.stderr or r.stdout).strip()[:300]}")
    out.write_text(r.stdout.strip() + "\n")
    out.chmod(0o600)
    return out


# ---- pyslurm, built against the prefix


def pyslurm_env(prefix: Path) -> dict[str, str]:
    """What pyslurm's setup.py reads to find Slurm (the admin's build env too)."""
    return {
        "SLURM_INCLUDE_DIR": str(prefix / "include"),
        "SLURM_LIB_DIR": str(prefix / "lib"),
    }


def pyslurm_installed(python: str = sys.executable) -> str | None:
    """The pyslurm version importable by `python`, or None."""
    r = subprocess.run(
        [python, "-c", "import pyslurm; print(pyslurm.__version__)"],
        env={**os.environ, "PYSLURM_DISABLE_AUTO_INIT": "1"},  # needs no slurm.conf
        capture_output=True,
        text=True,
        timeout=60,
    )
    return r.stdout.strip() if r.returncode == 0 else None


def _wheel_dir(prefix: Path, python: str) -> Path:
    tag = subprocess.run(
        [python, "-c", "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()
    return prefix.parent / f"pyslurm-{PYSLURM_VERSION}-{prefix.name}-{tag}"


def ensure_pyslurm(version: str = "25.11", python: str = sys.executable) -> str:
    """Install pyslurm built against Slurm `version`'s prefix into `python`'s environment
    unless it is there already; the wheel is built once (about 3 minutes) and cached."""
    have = pyslurm_installed(python)
    if have == PYSLURM_VERSION:
        return have
    prefix = ensure_prefix(version)
    wheels = _wheel_dir(prefix, python)
    with machine_lock(prefix.parent / f"{wheels.name}.lock"):
        built = sorted(wheels.glob("pyslurm-*.whl"))
        if not built:
            tmp = wheels.with_name(wheels.name + "-tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            log = prefix.parent / f"{wheels.name}-build.log"
            log.write_text("")
            pip = [python, "-m", "pip", "-q", "--disable-pip-version-check"]
            _build_step([*pip[:3], "install", "-q", "cython>=3"], tmp, log, 600, "cython")
            env = {**os.environ, **pyslurm_env(prefix), "PYSLURM_BUILD_JOBS": "2"}
            with log.open("ab") as out:
                # no build isolation: setuptools/Cython come from the venv (offline re-builds)
                r = subprocess.run(
                    [
                        "nice",
                        "-n",
                        "10",
                        *pip,
                        "wheel",
                        "--no-deps",
                        "--no-build-isolation",
                        "--no-binary",
                        "pyslurm",
                        "-w",
                        str(tmp),
                        f"pyslurm=={PYSLURM_VERSION}",
                    ],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=1800,
                )
            if r.returncode != 0:
                raise SourceError(f"building pyslurm {PYSLURM_VERSION} failed; log: {log}")
            shutil.rmtree(wheels, ignore_errors=True)
            tmp.rename(wheels)
            built = sorted(wheels.glob("pyslurm-*.whl"))
        r2 = subprocess.run(
            [
                python,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--force-reinstall",
                str(built[-1]),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if r2.returncode != 0:
            raise SourceError(f"installing {built[-1].name} failed: {r2.stderr.strip()[-300:]}")
    return PYSLURM_VERSION


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--version", default="25.11", choices=sorted(SOURCES))
    ap.add_argument("--pyslurm", action="store_true", help="also install pyslurm into this venv")
    args = ap.parse_args(argv)
    try:
        prefix = ensure_prefix(args.version)
        print(f"Slurm {SOURCES[args.version].version}: {prefix}")
        if args.pyslurm:
            print(f"pyslurm {ensure_pyslurm(args.version)} built against {prefix}")
    except SourceError as exc:
        print(f"warning: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
