"""The product as a site installs it: the babysitter wheel, non-editable, in a venv of its own.

Used where a figure or a test must be about the installed package, not the checkout: the wheel
tests (tests/test_wheel.py), and the one-shot `babysitter check` the NHC benchmark measures (an
editable install resolves every import through setuptools' finder: more memory and CPU than any
site pays). The venv's third-party dependencies are installed once per dependency list; the
babysitter wheel is rebuilt and reinstalled on every call.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV_CACHE = Path(os.environ.get("BABYSITTER_WHEEL_VENV_CACHE", "/tmp/babysitter-wheel-venv"))
# the benchmarks' own: a test run may be reinstalling the suite's meanwhile
WHEEL_CACHE = Path("/tmp/babysitter-bench-wheel-venv")


def deps_key() -> str:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + project["optional-dependencies"]["postgres"]
    return hashlib.sha256(json.dumps(sorted(deps)).encode()).hexdigest()[:16]


def clean_env(**extra: str) -> dict[str, str]:
    """No trace of the checkout: no PYTHONPATH, no babysitter settings of the caller."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("BABYSITTER_", "PYTHON", "VIRTUAL_ENV"))
    }
    env.update(extra)
    return env


def installed_wheel(build_dir: Path, cache: Path = VENV_CACHE) -> Path:
    """Build the wheel into `build_dir` and install it into the cached venv under `cache`;
    the venv's path (its `bin/babysitter` is the console script a site runs)."""
    # setuptools builds in the checkout's build/: one build at a time (packaging/build.py takes
    # the same lock; two at once under pytest-xdist failed on build/bdist.*/wheel/...)
    lock = REPO / "build" / ".wheel.lock"
    lock.parent.mkdir(exist_ok=True)
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(build_dir),
             str(REPO)],
            check=True,
            capture_output=True,
            timeout=300,
            cwd=build_dir,
        )  # fmt: skip
    (wheel,) = build_dir.glob("babysitter-*.whl")
    venv = cache / deps_key()
    py = venv / "bin" / "python"
    if not (venv / ".deps-installed").exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        subprocess.run(
            [str(py), "-m", "pip", "install", "-q", f"{wheel}[postgres]"],
            check=True,
            timeout=900,
            env=clean_env(),
        )
        (venv / ".deps-installed").touch()
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)],
        check=True,
        timeout=300,
        env=clean_env(),
    )
    return venv
