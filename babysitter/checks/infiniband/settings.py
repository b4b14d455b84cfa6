"""`[checks.infiniband]`: what the InfiniBand check reads (config.py assembles it into `Config`)."""

from typing import Annotated

from msgspec import Meta

from babysitter.settings import CheckConfig


class InfinibandCheckConfig(CheckConfig):
    expected_ports: (
        Annotated[
            int, Meta(ge=0, description="ACTIVE ports expected (default: the hardware profile's)")
        ]
        | None
    ) = None
    expected_rate_gbps: (
        Annotated[
            float,
            Meta(gt=0, description="rate each port must have (default: the hardware profile's)"),
        ]
        | None
    ) = None
    flap_recovery_s: (
        Annotated[
            float,
            Meta(gt=0, description="opt-in: forgive flaps after the port is stable this long"),
        ]
        | None
    ) = None
