"""After a configuration reload (babysitter/reload.py, SIGHUP): refresh the policy loop's few
values copied from the config at start. Everything else reads `cfg.<section>.<key>` when it
acts, and the reload has written the new values there already. Runs on the policy loop's
thread, between two ticks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from babysitter.controller.loop.admit.admission import Limits
from babysitter.controller.loop.admit.maintenance import Alertmanager
from babysitter.controller.loop.decide.blast import BlastSettings
from babysitter.controller.loop.decide.fabric import FabricSettings
from babysitter.controller.loop.decide.ladder import LadderTable
from babysitter.controller.loop.decide.node.facts_model import PolicySettings
from babysitter.controller.loop.decide.stragglers import StragglerSettings
from babysitter.controller.loop.record.alerts import Alert
from babysitter.controller.loop.record.alerts.router import sinks_from_config
from babysitter.finding import Severity

CONDITION = "config_reload_failed"


def reconfigure(engine: Any) -> None:
    """Thresholds, caps and alert sinks from the (reloaded) config of `engine`, the
    RemediationEngine (not imported: it imports this module)."""
    cfg = engine.cfg
    settings = PolicySettings.from_config(cfg)
    engine.settings = settings
    engine.gatherer.settings = settings
    engine.outcome.settings = settings
    engine.fabric.policy = settings
    engine.healer.dry_run = settings.dry_run
    engine.fabric.settings = FabricSettings.from_config(cfg)
    engine.fabric.blast = BlastSettings.from_config(cfg)
    engine.admission.limits = Limits.from_config(cfg)
    engine.fabric.enabled = cfg.fabric.enabled
    engine.gatherer.straggler_settings = StragglerSettings.from_config(cfg)
    engine.healer.validation_user = cfg.validation.user
    engine.healer.validation_minutes = cfg.validation.time_limit_min + 5
    engine.healer.ladder = LadderTable.from_config(cfg.remediation)
    engine.healer.lemon_drains = (cfg.policy.lemon_drains, cfg.policy.lemon_window_days)
    engine.healer.fabric_rung.timeout_s = cfg.remediation.reset_timeout_s
    # validation turned on live: its poll must run, else validating nodes wait for ever; turned
    # off, the poll still runs (validations already submitted finish)
    engine.validator.enabled = engine.validator.enabled or cfg.validation.enabled(cfg.policy)
    am = cfg.alerts.alertmanager_url
    engine.maintenance.am = Alertmanager(am) if am else None  # the windows' silences
    engine.sdc.user = cfg.validation.user
    engine.sdc.heartbeat_s = cfg.controller.heartbeat_timeout_s
    engine.healer.heartbeat_s = cfg.controller.heartbeat_timeout_s  # after_rung.py's bound
    engine.sdc.rpc.rate = cfg.checks.sdc.max_slurm_rpc_per_s
    engine.domains.settings = FabricSettings.from_config(cfg)  # NVLink domains: the same
    engine.domains.policy = settings
    engine.domains.enabled = cfg.fabric.enabled
    router = engine.router
    router.sinks = sinks_from_config(cfg)
    router.repeat_interval = timedelta(seconds=cfg.alerts.repeat_interval_s)
    router.group_threshold = cfg.alerts.group_threshold


def reload_alert(error: str, since: datetime | None = None) -> Alert:
    """The cluster-wide alert while the config file on disk is refused."""
    return Alert(
        None,
        CONDITION,
        Severity.WARNING,
        f"configuration reload refused: {error}"[:1000],
        "kept the previous configuration; fix the file and reload again",
        since or datetime.now(UTC),
    )
