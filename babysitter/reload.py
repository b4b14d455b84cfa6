"""`systemctl reload babysitter-*` (SIGHUP): re-read the config file, validate it, and apply
what can change while the daemon runs; what cannot is named ("needs restart: <keys>") and
left as it was. An invalid file changes nothing: the daemon keeps its configuration and says
why (log, metric, alert: see the daemons). Neither does a file that loosens a cap (`CAPS`)
without saying so: `[reload] allow_loosening_caps = true` in that file, else it is refused
like an invalid one, naming the caps it would loosen. Tightening needs no opt-in.

The live `Config` is its own holder: the new values are written into the running config's
section objects (msgspec structs, mutable), so everything that reads `cfg.<section>.<key>` when
it acts (the checks' thresholds, the agent's report interval, the policy loop's sections) sees
them at its next use. The few objects that copy values at start are refreshed by the daemon
after `apply` (the controller's policy settings, alert sinks, caps). A reload is applied between
two iterations of the daemon's main loop, never in the middle of one.

Docs: docs/deploy.md "Reload without restart" (#reload, #caps).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from babysitter.config import Config, load_config
from babysitter.errors import ConfigError
from babysitter.settings import Section

# Keys a running daemon cannot take (a dotted key, or a section/prefix ending in "."): the
# listener, the database, the secrets and TLS files, the Slurm backend, what is composed at
# start (which checks run, whether the controller remediates), the queues' sizes.
CONTROLLER_RESTART = (
    "controller.",  # listen, database_url, TLS, tokens, connection limits, ...; see _LIVE
    "slurm.",
    "remediation.enabled",
    "checks.sdc.enabled",
    "alerts.queue_size",
)
AGENT_RESTART = (
    "agent.",  # controller_url, token_file, node_name, spool, TLS, metrics_listen; see _LIVE
    "slurm.",
    "checks.*.enabled",  # the set of checks is composed at start
)
# sections the daemon does not read (one file may serve both): applied, not listed
CONTROLLER_UNUSED = ("agent.",)
AGENT_UNUSED = (
    "controller.",
    "policy.",
    "alerts.",
    "validation.",
    "fabric.",
    "blast_radius.",
    "remediation.",
    "reload.",  # what may loosen the caps, all of them the controller's
    "checks.sdc.max_concurrent",  # the controller's schedule reads it
)
# exceptions to the prefixes above: read at each use
_LIVE = frozenset(
    {
        "controller.loop_interval_s",
        "controller.heartbeat_timeout_s",
        "controller.history_lookback_days",
        "agent.interval_s",
        "agent.fast_interval_s",
    }
)


# The caps on what the controller takes out of service, at once or per hour. Each one loosens
# when it grows, and is lifted when unset (None); their upper bounds are in the config models
# (babysitter/config.py MAX_*, a fraction's is 1). A typo or a stale file must not widen them
# live with only a log line, hence the opt-in.
CAPS = (
    "policy.max_drained_fraction",
    "policy.min_drainable",  # a floor the fraction cannot go under: larger drains more
    "policy.max_drains_per_hour",
    "blast_radius.switch_fraction",
    "blast_radius.switch_count",
    "blast_radius.domain_fraction",
    "blast_radius.domain_count",
    "blast_radius.partition_fraction",
    "blast_radius.partition_count",
    "blast_radius.cluster_fraction",
    "blast_radius.cluster_count",
    "remediation.max_concurrent_reboots",
    "remediation.max_concurrent_fraction",
    "checks.sdc.max_concurrent",
)
OPT_IN = "[reload] allow_loosening_caps = true"


@dataclass
class Outcome:
    """What one reload did."""

    ok: bool
    applied: list[str] = field(default_factory=list)  # dotted keys now in effect
    needs_restart: list[str] = field(default_factory=list)  # changed, not applied
    error: str = ""  # why the file was refused (ok False)

    def summary(self) -> str:
        if not self.ok:
            return f"configuration reload refused, the previous configuration stays: {self.error}"
        parts = [f"applied: {', '.join(self.applied)}" if self.applied else "nothing changed"]
        if self.needs_restart:
            parts.append(f"needs restart: {', '.join(self.needs_restart)}")
        return "configuration reloaded; " + "; ".join(parts)


def changed_keys(old: Section, new: Section, prefix: str = "") -> list[str]:
    """Dotted keys whose value differs between two configs (or sections) of one model."""
    out: list[str] = []
    for name in type(old).__struct_fields__:
        a, b = getattr(old, name), getattr(new, name)
        if isinstance(a, Section) and isinstance(b, Section):
            out += changed_keys(a, b, f"{prefix}{name}.")
        elif msgspec.to_builtins(a, enc_hook=str) != msgspec.to_builtins(b, enc_hook=str):
            out.append(prefix + name)
    return out


def needs_restart(key: str, restart: tuple[str, ...]) -> bool:
    if key in _LIVE:
        return False
    parts = key.split(".")
    for r in restart:
        if r.endswith(".") and key.startswith(r):
            return True
        rp = r.split(".")
        if len(rp) == len(parts) and all(x in ("*", y) for x, y in zip(rp, parts, strict=True)):
            return True
    return False


def _get(cfg: Section, key: str) -> Any:
    for p in key.split("."):
        cfg = getattr(cfg, p)
    return cfg


def loosened(old: Config, new: Config, skip: tuple[str, ...] = ()) -> list[str]:
    """The caps `new` loosens against `old` ("key old -> new"), but those under `skip`. Each key
    is compared alone, so a count unset while a smaller fraction still binds counts too: on the
    safe side, the admin opts in once more."""
    out = []
    for key in CAPS:
        if key.startswith(skip):
            continue
        a, b = _get(old, key), _get(new, key)
        if a is not None and (b is None or b > a):
            out.append(f"{key} {a} -> {'unset (no cap)' if b is None else b}")
    return out


def _set(live: Section, new: Section, key: str) -> None:
    """Write one dotted key's new value into the live config's section object."""
    *path, name = key.split(".")
    for p in path:
        live, new = getattr(live, p), getattr(new, p)
    setattr(live, name, getattr(new, name))


def apply(
    live: Config, new: Config, restart: tuple[str, ...], unused: tuple[str, ...] = ()
) -> Outcome:
    """Write into `live` every changed key `new` has that may change while running (keys under
    `unused` too, without naming them: this daemon does not read them). A file that loosens a
    cap this daemon reads, without the opt-in, is refused whole and changes nothing."""
    if not new.reload.allow_loosening_caps and (loose := loosened(live, new, unused)):
        why = f"it loosens {', '.join(loose)}; to apply that, add {OPT_IN} to the file"
        return Outcome(ok=False, error=why)
    out = Outcome(ok=True)
    for key in changed_keys(live, new):
        if key.startswith(unused):
            _set(live, new, key)
        elif needs_restart(key, restart):
            out.needs_restart.append(key)
        else:
            _set(live, new, key)
            out.applied.append(key)
    return out


def reload(
    live: Config,
    path: str | Path | None,
    restart: tuple[str, ...],
    unused: tuple[str, ...] = (),
    loader: Callable[[str | Path | None], Config] = load_config,
) -> Outcome:
    """Read and validate the file at `path` (and the BABYSITTER_* environment, as at start),
    then apply it to `live`; an invalid one leaves `live` untouched."""
    try:
        new = loader(path)
    except ConfigError as exc:
        return Outcome(ok=False, error=str(exc))
    except Exception as exc:  # never let a reload take the daemon down
        return Outcome(ok=False, error=f"{type(exc).__name__}: {exc}")
    return apply(live, new, restart, unused)


def report_metric(outcome: Outcome | None, totals: dict[str, int]) -> dict[str, Any]:
    """The agent's reload state as its reports carry it (the controller stores the metrics)."""
    return {
        "ok": totals.get("ok", 0),
        "invalid": totals.get("invalid", 0),
        "last_ok": outcome is None or outcome.ok,
        "error": "" if outcome is None else outcome.error[:500],
    }
