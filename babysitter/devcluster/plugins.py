"""Install the top-level slurm-plugins/ (package babysitter.slurm_plugins: the babysit SPANK
plugin and job_submit.lua) into a devcluster, so tests and the demo use the real plugin. The
plugin is built against the Slurm headers of the cluster's installation (`include_dir`; a
chroot's own headers for newer versions)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from importlib.resources import files
from pathlib import Path

# Package data: admins build the plugin from an installed wheel, the devcluster does the same.
PLUGIN_DIR = Path(str(files("babysitter.slurm_plugins")))
SOURCE = PLUGIN_DIR / "babysit_spank.c"
LUA = PLUGIN_DIR / "job_submit.lua"


def build_plugin(
    out_dir: Path, include_dir: Path = Path("/usr/include"), cc: list[str] | None = None
) -> Path:
    """Compile babysit_spank.so (cached by source hash); `cc` may prefix a chroot."""
    digest = hashlib.sha256(SOURCE.read_bytes() + str(include_dir).encode()).hexdigest()[:12]
    so = out_dir / f"babysit_spank-{digest}.so"
    if so.exists():
        return so
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = so.with_suffix(".tmp")
    subprocess.run(
        [
            *(cc or ["gcc"]),
            "-O2",
            "-Wall",
            "-shared",
            "-fPIC",
            f"-I{include_dir}",
            "-o",
            str(tmp),
            str(SOURCE),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    tmp.replace(so)
    return so


def configure(
    base: Path, etc_dir: Path, root: Path | None = None, prefix: Path | None = None
) -> list[str]:
    """Called by DevCluster.up(): write plugstack.conf and job_submit.lua, return the
    slurm.conf lines that enable them. With a Debian root (newer Slurm), the plugin is built
    inside it against that version's headers (the base dir is bind-mounted there); with a
    source-built prefix (25.11), against the prefix's headers."""
    if root is not None:
        src = base / "plugins" / "babysit_spank.c"
        src.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SOURCE, src)
        so = base / "plugins" / "babysit_spank-root.so"
        subprocess.run(
            [
                "chroot",
                str(root),
                "gcc",
                "-O2",
                "-shared",
                "-fPIC",
                "-I/usr/include",
                "-o",
                str(so),
                str(src),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    elif prefix is not None:  # Slurm built from source: its own headers
        so = build_plugin(base / "plugins", include_dir=prefix / "include")
    elif not (Path("/usr/include/slurm/spank.h")).exists() or shutil.which("gcc") is None:
        return []  # no libslurm-dev / compiler: the --comment fallback still works
    else:
        so = build_plugin(base / "plugins")
    etc_dir.mkdir(parents=True, exist_ok=True)
    (etc_dir / "plugstack.conf").write_text(f"required {so}\n")
    shutil.copy(LUA, etc_dir / "job_submit.lua")
    return ["JobSubmitPlugins=lua"]
