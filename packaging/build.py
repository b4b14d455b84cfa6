"""`make package`: the .deb packages (and .rpm ones where rpmbuild exists) of babysitter.

Three packages, as Slurm's own are split (slurmd, slurmctld):

- babysitter: a self-contained virtual environment under /opt/babysitter (the project's wheel
  and its dependencies, byte-compiled), /usr/bin/babysitter, the `babysitter` system user,
  /etc/babysitter/babysitter.toml.example (every key with its packaged default, commented),
  the SPANK plugin's sources and their build hook (babysitter-build-spank);
- babysitter-agent: the agent's unit and the HealthCheckProgram wrapper (every GPU node);
- babysitter-controller: the controller's unit (the controller host).

The venv is built here, at package build time, with the Python the packages depend on
(/usr/bin/python3.11: Debian 12's python3, and RHEL 9's python3.11), then moved to its
installed path: a node's install is then a plain `dpkg -i` with no package index, no compiler
and no pip run on 2,000 nodes, every installed file is dpkg's (purge removes it), and every node
runs the same, tested bytes. The staging path is rewritten in the venv's scripts and the
byte-code is compiled with the installed path; the build fails if the staging path is left
anywhere.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = REPO / "packaging"
PREFIX = "/opt/babysitter"
PYTHON = os.environ.get("BABYSITTER_PACKAGE_PYTHON", "/usr/bin/python3.11")
CONFIG = "/etc/babysitter/babysitter.toml"
UNIT_DIR = "usr/lib/systemd/system"
MAINTAINER = "babysitter maintainers <babysitter@localhost>"
ROLES = ("agent", "controller")


def run(argv: list[str], **kw: object) -> None:
    subprocess.run(argv, check=True, timeout=1800, **kw)  # type: ignore[call-overload]


def version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def build_venv(stage: Path, work: Path) -> None:
    """The project's wheel and its dependencies in a venv at stage/opt/babysitter, relocated."""
    wheels = work / "wheel"
    wheels.mkdir()
    # setuptools builds in the checkout's build/: one build at a time (bench/wheel.py takes the
    # same lock; two at once under pytest-xdist failed on build/bdist.*/wheel/...)
    lock = REPO / "build" / ".wheel.lock"
    lock.parent.mkdir(exist_ok=True)
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(REPO)])
    (wheel,) = wheels.glob("babysitter-*.whl")
    venv = stage / PREFIX.lstrip("/")
    run([PYTHON, "-m", "venv", str(venv)])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile",
         f"{wheel}[postgres]"],
        env=env,
    )  # fmt: skip
    relocate(venv, str(venv), PREFIX)
    # ensurepip compiled pip's and setuptools' byte-code with the staging path: all again
    for cache in list(venv.rglob("__pycache__")):
        shutil.rmtree(cache)
    # byte-code as the installed files: paths in tracebacks are /opt/babysitter/...
    run(
        [str(venv / "bin" / "python"), "-m", "compileall", "-q", "-f", "-j", "0",
         "-s", str(stage), "-p", "/", str(venv / "lib")],
        # no byte-code from the interpreter's own imports (with the staging path)
        env={**env, "PYTHONDONTWRITEBYTECODE": "1"},
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    left = subprocess.run(
        ["grep", "-rlF", str(venv), str(venv)], capture_output=True, text=True, timeout=600
    ).stdout.split()
    if left:
        raise SystemExit(f"the staging path is left in: {left[:10]}")


def relocate(venv: Path, old: str, new: str) -> None:
    """The venv's own files that name its path: scripts' shebangs, activate*, pyvenv.cfg."""
    for path in [*(venv / "bin").iterdir(), venv / "pyvenv.cfg"]:
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if old.encode() in data:
            path.write_bytes(data.replace(old.encode(), new.encode()))


def defaults_example(venv: Path) -> str:
    """/etc/babysitter/babysitter.toml.example: every key with its default, commented,
    rendered by the packaged babysitter itself."""
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "babysitter.config_docs", "--example"],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return out.stdout


def unit(role: str) -> str:
    """The unit of systemd/, pointed at the packaged command, and started only with a config."""
    text = (REPO / "systemd" / f"babysitter-{role}.service").read_text()
    text = text.replace("/usr/local/bin/babysitter", f"{PREFIX}/bin/babysitter")
    cond = (
        "# Installed by the package before any configuration exists: no config, no start\n"
        f"# (enabled units stay inactive until {CONFIG} is written).\n"
        f"ConditionPathExists={CONFIG}\n"
    )
    return re.sub(r"(?m)^\[Service\]$", cond + "\n[Service]", text, count=1)


def install(src: Path | str, dest: Path, mode: int) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(src, Path):
        shutil.copyfile(src, dest)
    else:
        dest.write_text(src)
    dest.chmod(mode)


def trees(work: Path) -> dict[str, Path]:
    """The installed files of each package, under work/<package>/."""
    common = work / "babysitter"
    build_venv(common, work)
    venv = common / PREFIX.lstrip("/")
    (common / "usr" / "bin").mkdir(parents=True)
    (common / "usr" / "bin" / "babysitter").symlink_to(f"{PREFIX}/bin/babysitter")
    install(defaults_example(venv), common / "etc/babysitter/babysitter.toml.example", 0o644)
    for name in ("babysit_spank.c", "job_submit.lua", "Makefile"):
        install(
            REPO / "slurm-plugins" / name,
            common / "usr/share/babysitter/slurm-plugins" / name,
            0o644,
        )
    install(HERE / "babysitter-build-spank", common / "usr/sbin/babysitter-build-spank", 0o755)
    doc = common / "usr/share/doc/babysitter"
    for name in ("README.md",):
        install(REPO / name, doc / name, 0o644)
    install(REPO / "docs" / "deploy.md", doc / "deploy.md", 0o644)
    out = {"babysitter": common}
    for role in ROLES:
        tree = work / f"babysitter-{role}"
        install(unit(role), tree / UNIT_DIR / f"babysitter-{role}.service", 0o644)
        out[f"babysitter-{role}"] = tree
    hc = (REPO / "systemd" / "babysitter-healthcheck").read_text()
    hc = hc.replace("/usr/local/bin/babysitter", "/usr/bin/babysitter")
    hc = hc.replace("/usr/local/sbin/babysitter-healthcheck", "/usr/sbin/babysitter-healthcheck")
    install(hc, out["babysitter-agent"] / "usr/sbin/babysitter-healthcheck", 0o755)
    return out


DESCRIPTIONS = {
    "babysitter": "GPU cluster health for Slurm: the babysitter command and its Python runtime",
    "babysitter-agent": "GPU cluster health for Slurm: the node agent (every GPU node)",
    "babysitter-controller": "GPU cluster health for Slurm: the controller (API, policy, Slurm)",
}


def deb(name: str, tree: Path, ver: str, out: Path) -> Path:
    debian = tree / "DEBIAN"
    debian.mkdir()
    # the units' ExecReload is /bin/kill (procps)
    depends = "python3.11, passwd" if name == "babysitter" else f"babysitter (= {ver}), procps"
    size = sum(p.lstat().st_size for p in tree.rglob("*") if not p.is_dir()) // 1024
    control = (
        f"Package: {name}\nVersion: {ver}\nArchitecture: amd64\nMaintainer: {MAINTAINER}\n"
        f"Installed-Size: {size}\nDepends: {depends}\nSection: admin\nPriority: optional\n"
        f"Homepage: https://github.com/babysitter/babysitter\n"
        f"Description: {DESCRIPTIONS[name]}\n"
        " Health checks of GPUs, InfiniBand and the host, reported to a controller that\n"
        " drains, requeues and resumes through Slurm. See /usr/share/doc/babysitter/deploy.md.\n"
    )
    (debian / "control").write_text(control)
    conffiles = sorted("/" + str(p.relative_to(tree)) for p in (tree / "etc").rglob("*")
                       if p.is_file()) if (tree / "etc").exists() else []  # fmt: skip
    if conffiles:
        (debian / "conffiles").write_text("".join(f"{c}\n" for c in conffiles))
    for script in ("postinst", "prerm", "postrm"):
        src = HERE / "debian" / f"{name}.{script}"
        if src.exists():
            install(src, debian / script, 0o755)
    path = out / f"{name}_{ver}_amd64.deb"
    # zstd: a tenth of xz's CPU time for the 200 MB venv, a few MB larger; Debian 12's dpkg
    # (the packages' target, for its python3.11) reads it
    run(["dpkg-deb", "--root-owner-group", "-Zzstd", "-z6", "--build", str(tree), str(path)],
        stdout=subprocess.DEVNULL)  # fmt: skip
    shutil.rmtree(debian)
    return path


def rpms(work: Path, trees_: dict[str, Path], ver: str, out: Path) -> list[Path]:
    top = work / "rpmbuild"
    for d in ("BUILD", "RPMS", "SOURCES", "SPECS", "SRPMS", "BUILDROOT"):
        (top / d).mkdir(parents=True)
    run(
        ["rpmbuild", "-bb", "--quiet", "--target", "x86_64",
         "--define", f"_topdir {top}", "--define", f"_stage {work}",
         "--define", f"_version {ver}", "--define", f"_scripts {HERE / 'rpm'}",
         str(HERE / "rpm" / "babysitter.spec")],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    made = []
    for rpm in sorted((top / "RPMS").rglob("*.rpm")):
        shutil.copyfile(rpm, out / rpm.name)
        made.append(out / rpm.name)
    return made


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "dist")
    ap.add_argument("--work", type=Path, default=REPO / "build" / "package")
    ap.add_argument("--no-rpm", action="store_true", help="only the .deb packages")
    args = ap.parse_args()
    if not Path(PYTHON).exists():
        raise SystemExit(f"{PYTHON} is missing: the packages are built with Debian 12's Python")
    start = time.monotonic()
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    args.out.mkdir(parents=True, exist_ok=True)
    ver = version()
    built = trees(args.work)
    made = [deb(name, tree, ver, args.out) for name, tree in built.items()]
    if args.no_rpm:
        pass
    elif shutil.which("rpmbuild"):
        made += rpms(args.work, built, ver, args.out)
    else:
        print("rpmbuild not found (Debian: apt-get install rpm): no .rpm built", file=sys.stderr)
    for path in made:
        print(f"{path}  {path.stat().st_size / 2**20:.1f} MiB")
    print(f"built in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
