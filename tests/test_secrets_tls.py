"""Secrets stay private and the controller can speak TLS (issue 14): token files written 0600,
daemons refuse a secret other users can read (one line naming the file and its mode), an
https controller verified against a locally made CA by the agent and the CLI; the agent drops
a report the controller refuses instead of replaying it forever."""

from __future__ import annotations

import json
import logging
import os
import ssl
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from babysitter.agent.shipper import Shipper, tls_verify
from babysitter.agent.spool import Spool
from babysitter.job import BabysitArgsError, babysit_spec, parse_babysit_args
from tests.fixtures.controller import (
    ControllerProcess,
    Secrets,
    config_env,
    controller_config,
    free_port,
    which,
)


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "babysitter.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_token_write_creates_0600(secrets: Secrets, tmp_path: Path):
    env = config_env(controller_config(secrets, "sqlite://"))
    out = tmp_path / "node.token"
    old = os.umask(0o022)
    try:
        r = run_cli("token", "node7", "--write", str(out), env=env)
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr
    assert out.stat().st_mode & 0o777 == 0o600
    assert out.read_text().strip() == secrets.node("node7")
    out.chmod(0o644)  # an existing loose file is replaced by a private one
    assert run_cli("token", "node7", "--write", str(out), env=env).returncode == 0
    assert out.stat().st_mode & 0o777 == 0o600


def test_agent_refuses_a_readable_token_file(secrets: Secrets, tmp_path: Path):
    token = secrets.node_token_file("node1")
    token.chmod(0o644)
    env = {
        **config_env(controller_config(secrets, "sqlite://")),
        "BABYSITTER_AGENT__TOKEN_FILE": str(token),
        "BABYSITTER_AGENT__NODE_NAME": "node1",
        "BABYSITTER_AGENT__SPOOL_PATH": str(tmp_path / "spool.db"),
    }
    r = run_cli("agent", env=env)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert str(token) in lines[0] and "0644" in lines[0]


def test_controller_refuses_a_readable_secret(secrets: Secrets, tmp_path: Path):
    (secrets.dir / "cluster.secret").chmod(0o640)
    cfg = controller_config(secrets, f"sqlite:///{tmp_path / 'c.db'}", port=free_port())
    r = run_cli("controller", env=config_env(cfg))
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "cluster.secret" in lines[0] and "0640" in lines[0]


def test_tls_round_trip_with_a_local_ca(secrets: Secrets, tmp_path: Path):
    (tmp_path / "pki").mkdir()
    ca, cert, key = make_ca(tmp_path / "pki")
    port = free_port()
    cfg = controller_config(
        secrets,
        f"sqlite:///{tmp_path / 'c.db'}",
        port=port,
        controller={"tls_cert_file": str(cert), "tls_key_file": str(key)},
    )
    ctl = ControllerProcess(
        cfg, env={"BABYSITTER_SLURM__SLURM_CONF": "/nonexistent"}, log=tmp_path / "ctl.log"
    )
    ctl.url = f"https://127.0.0.1:{port}"
    ctl.verify = tls_verify(ca)
    ctl.start()
    try:
        # the agent's shipper, verifying with the CA
        spool = Spool(tmp_path / "spool.db")
        ship = Shipper(ctl.url, secrets.node("node1"), spool, node="node1", ca_file=ca)
        rep = {
            "node": "node1",
            "report_id": str(uuid.uuid4()),
            "sent_at": datetime.now(UTC).isoformat(),
            "findings": [],
            "metrics": {},
        }
        assert ship._send_with_retry(rep) and ship.sent == 1 and ship.refused == 0
        # without the CA the certificate is not trusted
        with pytest.raises(httpx.ConnectError):
            httpx.get(ctl.url + "/healthz")
        # the CLI, verifying with agent.ca_file
        env = {**config_env(cfg), "BABYSITTER_AGENT__CONTROLLER_URL": ctl.url}
        r = run_cli("nodes", "--json", env={**env, "BABYSITTER_AGENT__CA_FILE": str(ca)})
        assert r.returncode == 0, r.stderr
        assert [n["name"] for n in json.loads(r.stdout)] == ["node1"]
        r = run_cli("nodes", "--json", env=env)
        assert r.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in r.stderr
    finally:
        ctl.stop()


def make_ca(d: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1, made with the openssl CLI."""
    openssl = which("openssl")
    subprocess.run(
        [
            openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=test CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        ],
        check=True, capture_output=True, cwd=d, timeout=60,
    )  # fmt: skip
    (d / "ca.key").chmod(0o600)
    (d / "ext.cnf").write_text(
        "basicConstraints=critical,CA:FALSE\nsubjectAltName=IP:127.0.0.1\n"
        "extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n"
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    subprocess.run(
        [openssl, "req", *ec, "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=127.0.0.1"],
        check=True, capture_output=True, cwd=d, timeout=60,
    )  # fmt: skip
    subprocess.run(
        [
            openssl, "x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "srv.pem", "-days", "2", "-extfile", "ext.cnf",
        ],
        check=True, capture_output=True, cwd=d, timeout=60,
    )  # fmt: skip
    (d / "srv.key").chmod(0o600)
    ssl.create_default_context(cafile=str(d / "ca.pem"))  # loads: a usable CA
    return d / "ca.pem", d / "srv.pem", d / "srv.key"


def test_agent_drops_a_report_the_controller_refuses(secrets, tmp_path, caplog):
    ctl = ControllerProcess(
        controller_config(secrets, f"sqlite:///{tmp_path / 'c.db'}", port=free_port()),
        env={"BABYSITTER_SLURM__SLURM_CONF": "/nonexistent"},
        log=tmp_path / "ctl.log",
    ).start()
    try:
        spool = Spool(tmp_path / "spool.db")
        ship = Shipper(ctl.url, secrets.node("node1"), spool, node="node1", retries=0)

        def rep(**extra: object) -> dict:
            return {
                "node": "node1",
                "report_id": str(uuid.uuid4()),
                "sent_at": datetime.now(UTC).isoformat(),
                "findings": [],
                "metrics": {},
                **extra,
            }

        # spooled while the controller was away: two it will refuse, then a good one
        bad = [rep(metrics={"big": "x" * (2 << 20)}) for _ in range(3)]
        bad.append(rep(node="node2"))  # 403: not this token's node
        bad.append(rep(metrics={"x": float("nan")}))  # not JSON: refused by the agent itself
        good = rep()
        for r in (*bad, good):
            spool.put(r)
        with caplog.at_level(logging.ERROR, logger="babysitter.agent.shipper"):
            assert ship._replay()
        assert spool.size() == 0
        assert ship.refused == 5 and spool.counter("refused") == 5
        refusals = [r for r in caplog.records if "refused" in r.getMessage()]
        assert len(refusals) == 3  # once per status (413, 403, the agent's own), not per report
        node = httpx.get(
            f"{ctl.url}/api/v1/nodes/node1",
            headers={"Authorization": f"Bearer {secrets.admin}"},
        ).json()
        assert node["last_report_at"] is not None
    finally:
        ctl.stop()


# ---- the babysit spec: the job owner's text


@pytest.mark.parametrize(
    "spec",
    [
        "babysit=max_requeues=²",
        "babysit=max_requeues=٣",
        "babysit=hang_timeout=" + "9" * 5000,
        "babysit=ckpt=/" + "a" * 5000,
        "babysit=ckpt=/x," + "max_requeues=1," * 2000,
        "babysit=max_requeues=-1",
        "babysit=max_requeues=1_0",
    ],
)
def test_hostile_babysit_specs_are_refused_not_raised(spec):
    with pytest.raises(BabysitArgsError):
        parse_babysit_args(spec)
    assert babysit_spec(spec) is None
    assert babysit_spec("", spec) is None


def test_babysit_spec_still_reads_good_ones():
    assert babysit_spec("x " * 40_000 + "babysit=ckpt=/r,max_requeues=3") is None  # past scan
    assert babysit_spec("babysit=ckpt=/r,max_requeues=3,hang_timeout=1800") == {
        "ckpt": "/r",
        "max_requeues": 3,
        "hang_timeout": 1800,
    }


def test_job_names_up_to_slurms_1024_are_stored(db_url):
    from babysitter.controller.db.store import Store

    store = Store(db_url)
    store.upgrade()
    try:
        store.upsert_job(1, name="n" * 1024, user="u" * 200, state="RUNNING", babysit={})
        store.upsert_job(2, name="é" * 3000, babysit={})
        jobs = {j["job_id"]: j for j in store.jobs()}
        assert jobs[1]["name"] == "n" * 1024 and jobs[1]["user"] == "u" * 64
        assert jobs[2]["name"] == "é" * 1024
    finally:
        store.close()
