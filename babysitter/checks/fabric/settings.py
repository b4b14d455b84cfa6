"""`[checks.fabric]`: what the fabric check (`gpu.fabric`) reads and when a state is a fault.
config.py assembles it into `Config`; whether a node has an NVSwitch fabric, runs Fabric Manager
or needs IMEX is its hardware profile's (babysitter/hardware/profiles.py) unless set here."""

from typing import Annotated

from msgspec import Meta

from babysitter.settings import CheckConfig


class FabricCheckConfig(CheckConfig):
    grace_s: Annotated[
        float,
        Meta(
            ge=0,
            description="a GPU's fabric may be NOT_STARTED or IN_PROGRESS this long (since boot "
            "and since the agent first saw it so) before it is critical",
        ),
    ] = 300.0
    fabric_manager: (
        Annotated[
            bool,
            Meta(
                description="the node runs nvidia-fabricmanager (default: the configured "
                "profile's; a detected NVSwitch profile: when a GPU reports a fabric)"
            ),
        ]
        | None
    ) = None
    imex: (
        Annotated[
            bool,
            Meta(
                description="the node needs nvidia-imex and an UP IMEX domain (default: the "
                "configured profile's; never on a detected profile)"
            ),
        ]
        | None
    ) = None
    systemctl: Annotated[str, Meta(description="systemctl binary asked for the services")] = (
        "systemctl"
    )
    imex_ctl: Annotated[
        str, Meta(description="nvidia-imex-ctl binary (`-N -j`: the IMEX domain's status)")
    ] = "nvidia-imex-ctl"
    command_timeout_s: Annotated[
        float, Meta(gt=0, description="each systemctl / nvidia-imex-ctl call may take this long")
    ] = 5.0
    restart_timeout_s: Annotated[
        float,
        Meta(
            gt=0,
            description="the restart_fabric rung: `systemctl restart` of nvidia-fabricmanager / "
            "nvidia-imex on the controller's order may take this long",
        ),
    ] = 120.0
