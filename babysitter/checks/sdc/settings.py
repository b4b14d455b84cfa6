"""`[checks.sdc]`: what the SDC test and its schedule read (config.py assembles it into
`Config`)."""

from typing import Annotated, Literal, get_args

from msgspec import Meta

from babysitter.settings import CheckConfig, InvalidKey

# the dtypes the SDC test's host-side verifier supports (checks/sdc/runner.py NP_DTYPES)
SdcDtype = Literal["float32", "float64", "float16"]


class SdcCheckConfig(CheckConfig):
    """The silent-data-corruption test (docs/checks.md, "Periodic SDC tests"). On by default:
    the controller orders it on idle nodes under a short Slurm hold, every `interval_s` per node
    (enabled = false on the controller stops the schedule)."""

    interval_s: Annotated[
        float, Meta(gt=0, description="test each node this often (seconds; idle nodes only)")
    ] = 4 * 3600.0
    backend: Annotated[
        Literal["auto", "numpy", "torch", "cupy"],
        Meta(
            description="matmul lib; auto = cupy or torch on the GPUs, and on a node with GPUs "
            "but neither, no test (numpy = test the CPU on purpose)"
        ),
    ] = "auto"
    size: Annotated[int, Meta(ge=16, description="matrix size n (n x n)")] = 2048
    dtype: Annotated[
        SdcDtype, Meta(description="element type: " + ", ".join(get_args(SdcDtype)))
    ] = "float32"
    seed: Annotated[int, Meta(description="input seed")] = 1234
    max_concurrent: Annotated[
        int,
        Meta(
            ge=1,
            le=1024,  # a cap on nodes held out of service: bounded (docs/deploy.md#caps)
            description="controller: nodes under test at once, cluster-wide (at most 1024)",
        ),
    ] = 64
    max_slurm_rpc_per_s: Annotated[
        float,
        Meta(
            gt=0,
            description="controller: Slurm calls the schedule may make per second on average "
            "(reservations created, shrunk, deleted; bursts of up to 5)",
        ),
    ] = 0.2
    hold_s: Annotated[
        float,
        Meta(
            ge=60,
            description="controller: the Slurm reservation that keeps jobs off a node under "
            "test ends by itself after this long, even if the controller is gone",
        ),
    ] = 600.0
    result_timeout_s: Annotated[
        float,
        Meta(
            gt=0,
            description="controller: a node whose agent has not answered the order within this "
            "long is released untested (and says why)",
        ),
    ] = 180.0
    max_rss_mb: Annotated[
        float,
        Meta(
            gt=0,
            description="the test runs in a child process of the agent; it is killed (no "
            "verdict) when its resident memory goes over this many MB",
        ),
    ] = 8192.0
    inject: Annotated[
        list[int] | None,
        Meta(
            description="fault injection [device, row, col, bit]: flip that bit of one "
            "device's result before verification (tests the pipeline end to end; never in "
            "production)"
        ),
    ] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.inject is not None and len(self.inject) != 4:
            raise InvalidKey("inject", "[device, row, col, bit], four integers")
        if self.result_timeout_s >= self.hold_s:
            raise InvalidKey("result_timeout_s", "must be shorter than hold_s")
