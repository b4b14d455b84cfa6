"""`[checks.xid]`: what the XID checks read (config.py assembles it into `Config`). The XID catalog
itself is hardware data (babysitter/hardware/xids.py)."""

from typing import Annotated, get_args

from msgspec import Meta, field

from babysitter.hardware.xids import KNOWN_XIDS, XidClass
from babysitter.settings import CheckConfig, InvalidKey

XID_CLASSES: tuple[str, ...] = get_args(XidClass)


class XidCheckConfig(CheckConfig):
    actions: Annotated[
        dict[int, XidClass],
        Meta(
            description="XID -> class overrides of the NVIDIA catalog "
            "(" + ", ".join(XID_CLASSES) + ")"
        ),
    ] = field(default_factory=dict)
    sbe_events_per_hour_warn: Annotated[
        float, Meta(gt=0, description="corrected-ECC events per GPU per hour that make a warning")
    ] = 100.0

    def __post_init__(self) -> None:
        super().__post_init__()
        unknown = sorted(set(self.actions) - KNOWN_XIDS)
        if unknown:
            raise InvalidKey(
                "actions", f"XID {', '.join(map(str, unknown))} is not in the XID catalog (a typo?)"
            )

    @property
    def overrides(self) -> dict[int, XidClass]:
        """`actions` (kept for the checks that read it by this name)."""
        return self.actions
