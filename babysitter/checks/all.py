"""Explicit list of check modules: importing this fills the registry (gpud's all.go)."""

from babysitter.checks import base

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
    import importlib

    for mod in CHECK_MODULES:
        prefix = HEAVY_INVASIVE.get(mod)
        if prefix and not invasive:
            names = wanted or []
            if not any(w == prefix or w.startswith(prefix + ".") for w in names):
                continue
        importlib.import_module(mod)
    return dict(base.REGISTRY)
