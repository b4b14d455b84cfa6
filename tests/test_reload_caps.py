"""Reloads and the caps on what the controller takes out of service (babysitter/reload.py
CAPS): a reload may tighten a cap; one that loosens it (raises it, or unsets it) is refused like
an invalid file unless the new file says `[reload] allow_loosening_caps = true`; and no file can
set a cap above its documented bound (docs/deploy.md#caps), at start or on reload. The process
test runs the real controller and sends the real signal (as tests/test_reload.py does)."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from babysitter.config import parse_config
from babysitter.devcluster.receiver import Receiver
from babysitter.reload import (
    AGENT_RESTART,
    AGENT_UNUSED,
    CONTROLLER_RESTART,
    CONTROLLER_UNUSED,
    apply,
    reload,
)
from tests.fixtures.controller import Secrets, free_port
from tests.fixtures.slurm import wait_for
from tests.test_reload import _clean_env, _controller_toml, _metric
from tests.test_reload import controller as controller  # the fixture: a running controller


def test_a_reload_that_loosens_a_cap_is_refused_whole_and_names_the_caps():
    """Raised, or unset (None: no cap at all): refused like an invalid file, old values kept,
    even the keys that were fine beside it."""
    start = {"blast_radius": {"cluster_count": 100}, "alerts": {"timeout_s": 5}}
    loosenings: dict[str, dict[str, Any]] = {
        "policy.max_drained_fraction": {"policy": {"max_drained_fraction": 0.3}},
        "policy.max_drains_per_hour": {"policy": {"max_drains_per_hour": 50}},
        "policy.min_drainable": {"policy": {"min_drainable": 4}},
        "blast_radius.switch_fraction": {"blast_radius": {"switch_fraction": None}},
        "blast_radius.cluster_count": {"blast_radius": {"cluster_count": None}},
        "remediation.max_concurrent_reboots": {"remediation": {"max_concurrent_reboots": 9}},
        "checks.sdc.max_concurrent": {"checks": {"sdc": {"max_concurrent": 65}}},
    }
    for key, change in loosenings.items():
        live = parse_config(start)
        new = parse_config({**start, "alerts": {"timeout_s": 9}, **change})
        if "blast_radius" not in change:
            new.blast_radius.cluster_count = 100
        out = apply(live, new, CONTROLLER_RESTART, CONTROLLER_UNUSED)
        assert not out.ok and not out.applied, key
        assert key in out.error and "allow_loosening_caps = true" in out.error, out.error
        assert "refused" in out.summary()
        assert live == parse_config(start), key  # nothing written, not even alerts.timeout_s
    live = parse_config(start)
    out = apply(live, parse_config({"blast_radius": {"switch_fraction": None}}), CONTROLLER_RESTART)
    assert "blast_radius.switch_fraction 0.5 -> unset (no cap)" in out.error
    assert "blast_radius.cluster_count 100 -> unset (no cap)" in out.error
    assert live.blast_radius.switch_fraction == 0.5


def test_the_opt_in_applies_a_loosening_and_tightening_needs_none():
    live = parse_config({"blast_radius": {"cluster_count": 100}})
    tighter = parse_config(
        {
            "policy": {"max_drains_per_hour": 5, "max_drained_fraction": 0.05},
            "blast_radius": {"switch_fraction": 0.25, "cluster_count": 10, "domain_count": 4},
        }
    )
    out = apply(live, tighter, CONTROLLER_RESTART, CONTROLLER_UNUSED)
    assert out.ok and "policy.max_drains_per_hour" in out.applied
    assert live.policy.max_drains_per_hour == 5 and live.blast_radius.domain_count == 4
    looser = parse_config(
        {
            "reload": {"allow_loosening_caps": True},
            "policy": {"max_drains_per_hour": 50},
            "blast_radius": {"switch_fraction": None},
        }
    )
    out = apply(live, looser, CONTROLLER_RESTART, CONTROLLER_UNUSED)
    assert out.ok, out.error
    assert live.policy.max_drains_per_hour == 50 and live.blast_radius.switch_fraction is None
    assert live.blast_radius.cluster_count is None  # unset: lifted, as the file says
    # the agent reads none of the caps: a file shared with the controller is no reason to refuse
    out = apply(
        parse_config({}),
        parse_config(
            {"policy": {"max_drains_per_hour": 50}, "checks": {"sdc": {"max_concurrent": 99}}}
        ),
        AGENT_RESTART,
        AGENT_UNUSED,
    )
    assert out.ok and not out.applied


def test_every_cap_has_an_upper_bound_documented_and_enforced():
    """A fraction's bound is 1 (its type); a count's is in the model (MAX_* in config.py). A
    file above it is refused at start (the daemon's load) and on reload, opt-in or not."""
    import msgspec

    from babysitter.reload import CAPS

    text = (Path(__file__).resolve().parents[1] / "docs" / "deploy.md").read_text()
    after = text.split('<a id="caps"></a>', 1)[1].splitlines()
    start = next(i for i, line in enumerate(after) if line.startswith("|"))
    caps_table = "\n".join(itertools.takewhile(lambda x: x.startswith("|"), after[start:]))
    for key in CAPS:
        assert f"`{key}`" in caps_table, key
        *path, name = key.split(".")
        section: object = parse_config({})
        for p in path:
            section = getattr(section, p)
        bound = next(
            m.le
            for m in _metas(msgspec.inspect.type_info(type(section)), name)
            if m is not None and m.le is not None
        )
        assert bound <= (1 if name.endswith("fraction") else 10_000), key
        assert f"{bound:g}" in caps_table.split(f"`{key}`", 1)[1].split("\n", 1)[0], key


def _metas(info: object, name: str) -> list[Any]:
    """The numeric types (with their bounds) a struct's field may hold."""
    import msgspec

    def plain(t: object) -> object:
        return plain(t.type) if isinstance(t, msgspec.inspect.Metadata) else t

    assert isinstance(info, msgspec.inspect.StructType)
    t = plain(next(f for f in info.fields if f.name == name).type)
    types = [plain(x) for x in t.types] if isinstance(t, msgspec.inspect.UnionType) else [t]
    return [x for x in types if isinstance(x, msgspec.inspect.IntType | msgspec.inspect.FloatType)]


def test_a_cap_above_its_bound_is_refused_at_start_and_on_reload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, secrets: Secrets
):
    for k in [k for k in os.environ if k.startswith("BABYSITTER_")]:
        monkeypatch.delenv(k)
    cfg = tmp_path / "controller.toml"
    good = _controller_toml(secrets, tmp_path / "c.db", free_port(), "http://127.0.0.1:1/h", 60)
    cfg.write_text(good + "\n[policy]\nmax_drains_per_hour = 1001\n")
    # at start: the controller does not come up, and says which key
    start = subprocess.run(
        [sys.executable, "-m", "babysitter.cli.main", "controller", "--config", str(cfg)],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert start.returncode != 0
    assert "policy.max_drains_per_hour" in start.stdout + start.stderr
    # on reload, with the opt-in too: the running values stay
    live = parse_config({})
    cfg.write_text(
        "[reload]\nallow_loosening_caps = true\n[remediation]\nmax_concurrent_reboots = 65\n"
    )
    out = reload(live, cfg, CONTROLLER_RESTART, CONTROLLER_UNUSED)
    assert not out.ok and "remediation.max_concurrent_reboots" in out.error
    assert live.remediation.max_concurrent_reboots == 2


def _caps(url: str, secrets: Secrets) -> tuple[object, object, object]:
    """The caps in force, as the running controller shows them (GET /api/v1/guard): the drain
    budget, the switch fraction, the cluster count."""
    admin = {"Authorization": f"Bearer {secrets.admin}"}
    g = httpx.get(url + "/api/v1/guard", headers=admin, timeout=5).json()
    blast = g["blast_radius"]["caps"]
    return (
        (g.get("limits") or {}).get("max_drains_per_hour"),
        blast.get("switch", {}).get("fraction"),
        blast.get("cluster", {}).get("count"),
    )


def _alerts(receiver: Receiver, state: str) -> list[dict[str, str]]:
    return [
        b
        for b in receiver.bodies("/hook")
        if b.get("condition") == "config_reload_failed" and b.get("state") == state
    ]


def _count_is(receiver: Receiver, state: str, n: int) -> bool:
    return len(_alerts(receiver, state)) == n


def test_controller_sighup_refuses_a_loosened_cap_until_the_file_opts_in(
    controller: tuple[subprocess.Popen[bytes], Path, str],
    secrets: Secrets,
    receiver: Receiver,
    tmp_path: Path,
):
    """Each loosening (a fraction raised, the drain budget raised, a count unset) is refused:
    counted invalid, the gauge 0, logged, alerted; the caps in force stay. The file put back
    applies (the alert resolves); a tightening needs no opt-in; a loosening with it applies."""
    proc, cfg, url = controller
    metrics, base = url + "/metrics", cfg.read_text()

    def write(policy: str, blast: str, reload_: str = "") -> None:
        cfg.write_text(f"{base}\n[policy]\n{policy}\n[blast_radius]\n{blast}\n{reload_}")
        proc.send_signal(signal.SIGHUP)

    def reloads(result: str) -> float | None:  # None while /metrics answers 429: asked again
        return _metric(metrics, f'babysitter_config_reload_total{{result="{result}"}}')

    write("max_drains_per_hour = 20", "switch_fraction = 0.5\ncluster_count = 100")
    wait_for(lambda: reloads("ok") == 1, 30, "the first caps applied")
    wait_for(lambda: _caps(url, secrets) == (20, 0.5, 100), 60, "the caps in force")
    refused = [
        ("max_drains_per_hour = 20", "switch_fraction = 0.9\ncluster_count = 100", "switch_frac"),
        ("max_drains_per_hour = 50", "switch_fraction = 0.5\ncluster_count = 100", "per_hour"),
        ("max_drains_per_hour = 20", "switch_fraction = 0.5", "cluster_count"),  # unset: lifted
    ]
    for i, (policy, blast, key) in enumerate(refused, start=1):
        write(policy, blast)
        wait_for(partial(lambda n: reloads("invalid") == n, i), 30, f"refusal {i} counted")
        wait_for(lambda: _metric(metrics, "babysitter_config_last_reload_success") == 0, 30, "0")
        wait_for(partial(_count_is, receiver, "firing", i), 60, f"refusal {i} alerted")
        firing = _alerts(receiver, "firing")
        assert key in firing[-1]["summary"] and "allow_loosening_caps" in firing[-1]["summary"]
        log = (tmp_path / "controller.log").read_text()
        assert log.count("configuration reload refused") == i and key in log
        assert _caps(url, secrets) == (20, 0.5, 100)  # the old caps act
        # the file put back: nothing loosens, it applies, and the alert resolves
        write("max_drains_per_hour = 20", "switch_fraction = 0.5\ncluster_count = 100\n")
        wait_for(partial(_count_is, receiver, "resolved", i), 60, f"resolved {i}")
    write("max_drains_per_hour = 10", "switch_fraction = 0.4\ncluster_count = 100")
    wait_for(lambda: _caps(url, secrets) == (10, 0.4, 100), 60, "tightened without the opt-in")
    opt_in = "[reload]\nallow_loosening_caps = true"
    write("max_drains_per_hour = 50", "switch_fraction = 0.9", opt_in)
    wait_for(lambda: _caps(url, secrets) == (50, 0.9, None), 60, "loosened with the opt-in")
    wait_for(lambda: reloads("ok") == 6, 30, "the good reloads counted")
    wait_for(lambda: reloads("invalid") == 3, 30, "no more refusals")
    assert proc.poll() is None
