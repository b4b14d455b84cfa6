"""`[checks.gpu]`: what the GPU checks read, their thresholds typed (a misspelt threshold is a
config error naming it, not a KeyError at run time). config.py assembles it into `Config`.

Sources of the defaults: Azure HPC health checks, gpud, NVIDIA docs (see the domain notes).
What differs by GPU model (the NVLinks a board has) is hardware data the checks read from the
node's profile (babysitter/hardware/profiles.py), unless a threshold here sets it.
"""

from typing import Annotated

from msgspec import Meta, field

from babysitter.settings import CheckConfig, Section

_Count = Annotated[int, Meta(ge=0)]


class GpuThresholds(Section):
    """`[checks.gpu.thresholds]`: when a GPU reading is a finding."""

    dbe_volatile_max: Annotated[
        _Count, Meta(description="volatile uncorrectable ECC errors tolerated (Azure HPC: none)")
    ] = 0
    dbe_aggregate_max: Annotated[
        _Count,
        Meta(description="lifetime uncorrectable ECC errors tolerated before a warning (history)"),
    ] = 0
    sbe_volatile_warn: Annotated[
        _Count, Meta(description="volatile corrected ECC errors above this warn (Azure HPC)")
    ] = 10_000
    retired_pages_max: Annotated[
        _Count, Meta(description="retired pages tolerated; one more is critical (Azure HPC: 61)")
    ] = 61
    remap_uncorrectable_max: Annotated[
        _Count,
        Meta(description="rows remapped for uncorrectable errors tolerated (Azure HPC: 512)"),
    ] = 512
    temp_warn_margin_c: Annotated[
        float, Meta(ge=0, description="warn this far below the board's own slowdown temperature")
    ] = 5.0
    pcie_width_min_fraction: Annotated[
        float, Meta(gt=0, le=1, description="PCIe link width below this fraction of max warns")
    ] = 1.0
    pcie_replays_per_min_warn: Annotated[
        float, Meta(ge=0, description="PCIe replays a minute above this warn (DCGM: 8)")
    ] = 8.0
    expected_nvlinks: Annotated[
        _Count | None,
        Meta(
            description="NVLinks each GPU must have up; links past it only warn (default: the "
            "hardware profile's; 0: every link the board has)"
        ),
    ] = None
    nvlink_error_delta_warn: Annotated[
        _Count, Meta(description="NVLink error counter increase per read that warns")
    ] = 100


class GpuCheckConfig(CheckConfig):
    expected_count: (
        Annotated[
            int,
            Meta(ge=0, description="GPUs this node must have (default: the configured profile's)"),
        ]
        | None
    ) = None
    thresholds: Annotated[
        GpuThresholds, Meta(description="when a GPU reading is a finding (table below)")
    ] = field(default_factory=GpuThresholds)
