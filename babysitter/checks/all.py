"""Every check and event source, listed explicitly (gpud's components/all/all.go): the one place
that knows which checks exist. Only the composition points import it (the agent daemon and
`babysitter check`); no check module does, and nothing registers itself on import.

The SDC test needs numpy: its check imports the runner only when a test runs, so an agent
carries the check (it runs on the controller's order) without paying for numpy until then.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import msgspec

from babysitter.checks.base import Check, CheckContext, EventSource
from babysitter.checks.fabric.check import GpuFabricCheck
from babysitter.checks.gpu import check as gpu
from babysitter.checks.gpu.recovery import GpuRecoveryCheck
from babysitter.checks.host import check as host
from babysitter.checks.infiniband import check as infiniband
from babysitter.checks.nccl import check as nccl
from babysitter.checks.sdc.check import SdcCheck
from babysitter.checks.xid import check as xid
from babysitter.config import Config
from babysitter.errors import BabysitterError, ConfigError, UsageError


class Entry(msgspec.Struct, frozen=True):
    name: str  # the check's name (Check.name), matched by --only / agent.enabled_checks
    section: str  # its [checks.<section>] (Check.section)
    make: Callable[[CheckContext], Check]
    invasive: bool = False  # uses the GPUs: runs only when named explicitly
    # runs only when the controller orders it: an agent carries it by default
    ordered: bool = False
    timeout_s: float = 10.0
    signals: Mapping[str, object] = msgspec.field(default_factory=dict)  # its tier table

    @classmethod
    def of(cls, check: type[Check]) -> Entry:
        return cls(
            check.name,
            check.section,
            check,
            check.invasive,
            check.ordered,
            check.timeout_s,
            check.signals,
        )


CHECKS: tuple[Entry, ...] = (
    Entry.of(gpu.GpuPresenceCheck),
    Entry.of(gpu.GpuMemoryCheck),
    Entry.of(gpu.GpuNvlinkCheck),
    Entry.of(gpu.GpuPcieCheck),
    Entry.of(gpu.GpuThermalCheck),
    Entry.of(GpuFabricCheck),  # reads nothing on a profile without NVSwitch
    Entry.of(GpuRecoveryCheck),
    Entry.of(xid.KmsgXidCheck),
    Entry.of(host.HostCheck),
    Entry.of(infiniband.InfinibandCheck),
    Entry.of(nccl.NcclPerfCheck),
    Entry.of(nccl.NcclLogCheck),
    Entry.of(SdcCheck),  # numpy is imported only once a test runs
)

# Push findings from their own thread as events happen (the agent only; a one-shot run polls).
EVENT_SOURCES: tuple[Callable[[CheckContext], EventSource], ...] = (xid.NvmlEvents,)


class Composition(msgspec.Struct):
    checks: list[Check]
    sources: list[EventSource]  # not started; the agent starts the supported ones


def _named(name: str, wanted: Sequence[str]) -> bool:
    """`gpu` names gpu.*; `gpu.memory` names itself."""
    return any(name == w or name.startswith(w + ".") for w in wanted)


def select_checks(
    ctx: CheckContext,
    only: list[str] | None = None,
    include_invasive: bool = False,
    include_ordered: bool = False,
) -> list[Check]:
    """Instantiate the enabled, supported checks; `only` (else `agent.enabled_checks`) matches
    names or name prefixes. An invasive check runs only when one of them names it (or with
    include_invasive): the default set never takes the GPUs from a job. include_ordered (the
    agent): invasive checks that run only on the controller's order are in the default set,
    since the controller's Slurm hold is what makes them safe (loop/sdc/schedule.py)."""
    if only:
        _known_names(only, "--only", UsageError)
    check_config(ctx.config)
    wanted = only or ctx.config.agent.enabled_checks
    out: list[Check] = []
    for entry in sorted(CHECKS, key=lambda e: e.name):
        if wanted and not _named(entry.name, wanted):
            continue
        ordered_ok = include_ordered and entry.ordered
        if entry.invasive and not include_invasive and not wanted and not ordered_ok:
            continue
        check = entry.make(ctx)
        if not check.enabled() or not check.supported():
            continue
        out.append(check)
    return out


def invasive_named(ctx: CheckContext, wanted: Sequence[str]) -> list[float]:
    """The timeouts of the invasive checks `wanted` names (config overrides included)."""
    out = []
    for e in CHECKS:
        if e.invasive and _named(e.name, wanted):
            cfg = ctx.check_config(e.section)
            out.append(float(cfg.timeout_s if cfg and cfg.timeout_s else e.timeout_s))
    return out


def check_config(cfg: Config) -> None:
    """What only the list of checks can tell about a config (`babysitter config check` asks too):
    the check names in agent.enabled_checks and the signal names in signal_intervals. A typo
    would silently leave a check out, or a signal at its default interval."""
    _known_names(cfg.agent.enabled_checks or [], "agent.enabled_checks", ConfigError)
    for section in type(cfg.checks).__struct_fields__:
        overrides = getattr(cfg.checks, section).signal_intervals
        known = {f"{e.name}/{sig}" for e in CHECKS if e.section == section for sig in e.signals}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ConfigError(
                f"checks.{section}.signal_intervals: {', '.join(unknown)} is not a signal of "
                f"[checks.{section}] (signals: {', '.join(sorted(known)) or 'none'})"
            )


def _known_names(names: list[str], where: str, error: type[BabysitterError]) -> None:
    unknown = [w for w in names if not any(_named(e.name, [w]) for e in CHECKS)]
    if unknown:
        known = ", ".join(sorted(e.name for e in CHECKS))
        raise error(f"{where}: {', '.join(unknown)} names no check (checks: {known})")


def compose(ctx: CheckContext, only: list[str] | None = None) -> Composition:
    """What an agent runs: the selected checks and the event sources."""
    return Composition(
        select_checks(ctx, only, include_ordered=True), [make(ctx) for make in EVENT_SOURCES]
    )
