"""Terminal escape sequences in text a node or a job owner controls (a finding's message, a
job's checkpoint path, a Slurm reason) never reach the on-call's terminal as they are: the real
`babysitter` CLI, against a real controller, writes them as visible escapes. Before, `ESC]0;…`
retitled the terminal and `ESC[2J` cleared it (rich strips only BEL, BS, CR and a few more)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import UTC, datetime

import httpx

from babysitter.controller.db.store import Store
from tests.fixtures.controller import ControllerProcess, controller_config, free_port

# what a job can print into its log (the NCCL log check reports it) or name its checkpoint
OSC_TITLE = "\x1b]0;owned\x07"
CLEAR = "\x1b[2J\x1b[H"
C1_CSI = "\x9b31m"  # the one-byte CSI of the C1 set
BIDI = "\u202e"  # right-to-left override: text that reads other than it is
HOSTILE = f"NCCL WARN {OSC_TITLE}rank 3{CLEAR} hung{C1_CSI}red {BIDI}gnp.exe"
# bytes that start a terminal control sequence, raw or UTF-8 encoded
RAW = (b"\x1b", b"\x07", b"\xc2\x9b", b"\xe2\x80\xae")


def cli(ctl: ControllerProcess, token: str, *args: str) -> bytes:
    r = subprocess.run(
        [sys.executable, "-m", "babysitter.cli.main", *args, "--url", ctl.url, "--token", token],
        env={**ctl.env, "COLUMNS": "400"},
        capture_output=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_the_cli_never_writes_a_terminal_escape_from_untrusted_text(secrets, tmp_path):
    db = f"sqlite:///{tmp_path / 'c.db'}"
    ctl = ControllerProcess(
        controller_config(secrets, db, free_port(), controller={"remediation": False}),
        log=tmp_path / "controller.log",
    ).start()
    try:
        report = {
            "node": "node3",
            "report_id": str(uuid.uuid4()),
            "sent_at": datetime.now(UTC).isoformat(),
            "findings": [
                {
                    "check": "nccl.log",
                    "component": "host",
                    "severity": "critical",
                    "code": "nccl.hang",
                    "message": HOSTILE,
                }
            ],
            "metrics": {},
        }
        r = httpx.post(
            ctl.url + "/api/v1/reports", json=report, headers=secrets.headers("node3"), timeout=30
        )
        assert r.status_code == 202, r.text
        store = Store(db)
        try:
            store.upsert_job(42, nodes=["node3"], state="RUNNING", resume_point=f"/ckpt/{CLEAR}7")
        finally:
            store.close()
        outputs = {
            args: cli(ctl, secrets.read, *args)
            for args in (("findings", "node3"), ("nodes", "node3"), ("jobs",), ("status",))
        }
    finally:
        ctl.stop()
    for args, out in outputs.items():
        for raw in RAW:
            assert raw not in out, (args, raw, out)
    # what was there is shown, visibly escaped
    assert (
        b"\\x1b]0;owned\\x07rank 3\\x1b[2J\\x1b[H hung\\x9b31mred \\u202egnp.exe"
        in (outputs[("findings", "node3")])
    )
    assert b"/ckpt/\\x1b[2J\\x1b[H7" in outputs[("jobs",)]
