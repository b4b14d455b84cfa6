"""Where the Slurm binaries of a cluster live: the host's, a Debian root (newer Slurm run
through chroot), or a prefix built from source (25.11, run in place). The one place that builds
argv for a Slurm binary."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from babysitter.slurm.parse import parse_version

SBIN = {"slurmctld", "slurmd", "slurmrestd", "munged", "slurmstepd"}


@dataclass(frozen=True)
class SlurmInstall:
    root: Path | None = None  # None: the host's installation
    prefix: Path | None = None  # Slurm built from source (devcluster/source.py); munged: host's

    def path(self, prog: str) -> str:
        """Absolute path of a program (inside the root when there is one)."""
        if self.prefix is not None:
            for d in ("sbin", "bin"):
                if (self.prefix / d / prog).exists():
                    return str(self.prefix / d / prog)
        if self.root is None:
            found = shutil.which(prog) or shutil.which(prog, path="/usr/sbin:/usr/bin:/sbin:/bin")
            if not found:
                raise FileNotFoundError(f"{prog} not found: install Slurm/munge (make setup)")
            return found
        for d in ("usr/sbin", "usr/bin", "sbin", "bin"):
            if (self.root / d / prog).exists():
                return f"/{d}/{prog}"
        raise FileNotFoundError(f"{prog} not found in {self.root}")

    def argv(self, prog: str, *args: str) -> list[str]:
        if self.root is None:
            return [self.path(prog), *args]
        return ["chroot", str(self.root), self.path(prog), *args]

    @cached_property
    def version(self) -> tuple[int, int]:
        """(major, minor) of Slurm, e.g. (22, 5)."""
        # slurmctld -V needs no slurm.conf (sinfo --version does)
        out = subprocess.run(
            self.argv("slurmctld", "-V"), capture_output=True, text=True, timeout=15
        )
        return parse_version(out.stdout + out.stderr)

    @property
    def version_str(self) -> str:
        major, minor = self.version
        return f"{major}.{minor:02d}"
