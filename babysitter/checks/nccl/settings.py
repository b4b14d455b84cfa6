"""`[checks.nccl]`: what the NCCL checks read (config.py assembles it into `Config`)."""

from pathlib import Path
from typing import Annotated

from msgspec import Meta, field

from babysitter.settings import CheckConfig


class NcclCheckConfig(CheckConfig):
    all_reduce_perf: Annotated[
        Path | None, Meta(description="path of nccl-tests all_reduce_perf")
    ] = None
    job_log_globs: Annotated[
        list[str], Meta(description="where to find babysat jobs' stdout/stderr")
    ] = field(default_factory=list)
    min_busbw_gbps: (
        Annotated[
            float,
            Meta(gt=0, description="bus bandwidth floor, GB/s (default: the hardware profile's)"),
        ]
        | None
    ) = None
    gpus: Annotated[int, Meta(ge=1, description="GPUs all_reduce_perf uses (-g)")] = 8
    min_bytes: Annotated[str, Meta(description="all_reduce_perf -b")] = "1G"
    max_bytes: Annotated[str, Meta(description="all_reduce_perf -e")] = "16G"
