"""Silent-data-corruption test: a seeded matmul on every local device, verified with
algorithm-based checksums (Huang & Abraham) and by bit-identical comparison across devices
(or against a stored golden digest when there is only one)."""

from babysitter.checks.sdc.runner import DeviceResult, SdcResult, run_sdc

__all__ = ["DeviceResult", "SdcResult", "run_sdc"]
