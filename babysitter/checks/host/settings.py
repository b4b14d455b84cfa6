"""`[checks.host]`: what the host check reads (config.py assembles it into `Config`)."""

from pathlib import Path
from typing import Annotated

from msgspec import Meta, field

from babysitter.settings import CheckConfig


class HostCheckConfig(CheckConfig):
    paths: Annotated[list[Path], Meta(description="disk paths")] = field(
        default_factory=lambda: [Path("/tmp")]
    )
    min_free_gb: Annotated[float, Meta(ge=0, description="free space below this is a warning")] = (
        5.0
    )
    min_free_memory_fraction: Annotated[float, Meta(ge=0, le=1, description="memory floor")] = 0.05
    mounts: Annotated[list[Path], Meta(description="mounts that must exist")] = field(
        default_factory=list
    )
    check_slurmd: Annotated[bool, Meta(description="slurmd must be running")] = True
