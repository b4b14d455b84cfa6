"""The remediation ladder as data: defaults from the XID catalog and the GPU checks, site
overrides of single entries, and every ladder ending with a human."""

from __future__ import annotations

import pytest

from babysitter.config import ConfigError, parse_config
from babysitter.controller.loop.decide.ladder import DEFAULT_LADDER, LadderTable, Rung
from babysitter.finding import Action
from babysitter.hardware.xids import CATALOG


def _table(**remediation: object) -> LadderTable:
    return LadderTable.from_config(parse_config({"remediation": remediation}).remediation)


def test_defaults_follow_the_xid_catalog():
    t = _table()
    assert t.rungs("xid.79", Action.REBOOT) == (Rung.REBOOT, Rung.INSPECT)
    for xid in CATALOG["reset_gpu"]:
        assert t.first(f"xid.{xid}", Action.RESET_GPU) is Rung.RESET_GPU
    # NVLink XID 74: NVIDIA's catalog says reset the GPU (or reboot) -> the reset rung
    assert t.rungs("xid.74", Action.RESET_GPU) == (Rung.RESET_GPU, Rung.REBOOT, Rung.INSPECT)
    assert t.first("xid.45", Action.INSPECT) is Rung.INSPECT
    assert t.rungs("row_remap.failed", Action.INSPECT) == (Rung.RMA,)
    # a code the table does not name climbs by the finding's recommended action
    assert t.rungs("gpu.something_new", Action.REBOOT) == (Rung.REBOOT, Rung.INSPECT)


def test_a_failed_rung_escalates_and_never_loops():
    t = _table()
    assert t.after("row_remap.pending", Action.RESET_GPU, Rung.RESET_GPU) is Rung.REBOOT
    assert t.after("row_remap.pending", Action.RESET_GPU, Rung.REBOOT) is Rung.INSPECT
    assert t.after("xid.79", Action.REBOOT, Rung.REBOOT) is Rung.INSPECT
    assert t.after("xid.79", Action.REBOOT, Rung.INSPECT) is Rung.INSPECT
    for klass, ladder in DEFAULT_LADDER.items():
        assert not ladder[-1].automatic, klass


def test_site_overrides_one_entry_and_still_ends_with_a_human():
    t = _table(ladder={"xid.79": ["reboot", "rma"], "gpu.lost": ["reboot"]})
    assert t.rungs("xid.79", Action.REBOOT) == (Rung.REBOOT, Rung.RMA)
    assert t.rungs("gpu.lost", Action.REBOOT) == (Rung.REBOOT, Rung.INSPECT)
    assert t.rungs("xid.48", Action.RESET_GPU) == DEFAULT_LADDER["xid.48"]


def test_an_unknown_rung_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match="ladder"):
        parse_config({"remediation": {"ladder": {"xid.79": ["power_cycle"]}}})
