"""Which module holds which `babysitter` command: each module exposes `commands:
list[click.Command]` and is imported only when one of its commands runs (COMMANDS names them).
Plain data, no click: `babysitter.cli.main` reads it before deciding whether click is needed."""

from __future__ import annotations

COMMANDS: dict[str, str] = {
    "config": "babysitter.cli.config_cmd",
    "devcluster": "babysitter.cli.devcluster_cmd",
    "slurm": "babysitter.cli.slurm_cmd",
    "check": "babysitter.cli.check_cmd",
    "controller": "babysitter.cli.daemon_cmd",
    "agent": "babysitter.cli.daemon_cmd",
    "token": "babysitter.cli.daemon_cmd",
    "db": "babysitter.cli.daemon_cmd",
    "status": "babysitter.cli.read_cmd",
    "nodes": "babysitter.cli.read_cmd",
    "findings": "babysitter.cli.read_cmd",
    "jobs": "babysitter.cli.read_cmd",
    "drain": "babysitter.cli.read_cmd",
    "resume": "babysitter.cli.read_cmd",
    "requeue": "babysitter.cli.read_cmd",
    "guard": "babysitter.cli.read_cmd",
    "resume-path": "babysitter.cli.job_cmd",
    "demo": "babysitter.cli.demo_cmd",
    "sdc-test": "babysitter.cli.sdc_cmd",
    "sdc-status": "babysitter.cli.sdc_cmd",
    "validate": "babysitter.cli.validate_cmd",
    "audit": "babysitter.cli.audit_cmd",
    "maintenance": "babysitter.cli.maintenance_cmd",
    "ledger": "babysitter.cli.ledger_cmd",
}

COMMAND_MODULES: list[str] = [
    "babysitter.cli.config_cmd",
    "babysitter.cli.devcluster_cmd",
    "babysitter.cli.slurm_cmd",
    "babysitter.cli.check_cmd",
    "babysitter.cli.daemon_cmd",
    "babysitter.cli.read_cmd",
    "babysitter.cli.job_cmd",
    "babysitter.cli.demo_cmd",
    "babysitter.cli.sdc_cmd",
    "babysitter.cli.validate_cmd",
    "babysitter.cli.audit_cmd",
    "babysitter.cli.maintenance_cmd",
    "babysitter.cli.ledger_cmd",
]
