"""Explicit list of check modules and the selection of the checks to run (gpud's all.go).
Nothing below imports this module: it is the composition root of the checks."""

import importlib

from babysitter.checks import base
from babysitter.checks.base import Check, CheckContext

# Each domain module registers its checks on import. Keep this list explicit.
CHECK_MODULES: list[str] = [
    "babysitter.checks.gpu",
    "babysitter.checks.xid",
    "babysitter.checks.host",
    "babysitter.checks.infiniband",
    "babysitter.checks.nccl",
    "babysitter.checks.sdc.check",
]
# Modules of invasive checks whose import is heavy (numpy): imported only when such a check can
# be selected, so the agent and the one-shot `check` do not pay for them. module -> name prefix
HEAVY_INVASIVE: dict[str, str] = {"babysitter.checks.sdc.check": "sdc"}


def load_all(wanted: list[str] | None = None, invasive: bool = True) -> dict[str, type[base.Check]]:
    """Import the check modules. With invasive=False, heavy invasive modules are imported only
    when `wanted` names (a prefix of) one of their checks."""

    for mod in CHECK_MODULES:
        prefix = HEAVY_INVASIVE.get(mod)
        if prefix and not invasive:
            names = wanted or []
            if not any(w == prefix or w.startswith(prefix + ".") for w in names):
                continue
        importlib.import_module(mod)
    return dict(base.REGISTRY)


def select_checks(
    ctx: CheckContext, only: list[str] | None = None, include_invasive: bool = False
) -> list[Check]:
    """Instantiate the enabled, supported checks; `only` matches names or name prefixes
    (`gpu` selects gpu.*)."""
    wanted = only or ctx.config.agent.enabled_checks
    out: list[Check] = []
    for name, cls in sorted(load_all(only, invasive=include_invasive).items()):
        if wanted and not any(name == w or name.startswith(w + ".") for w in wanted):
            continue
        if cls.invasive and not include_invasive and not only:
            continue
        check = cls(ctx)
        if not check.enabled() or not check.supported():
            continue
        out.append(check)
    return out
