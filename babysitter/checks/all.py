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


def load_all() -> dict[str, type[base.Check]]:
    import importlib

    for mod in CHECK_MODULES:
        importlib.import_module(mod)
    return dict(base.REGISTRY)
