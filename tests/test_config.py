"""Config: TOML + env overrides, and a clear one-line error naming a bad key."""

import subprocess
import sys
from pathlib import Path

import pytest

from babysitter.config import load_config
from babysitter.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "babysitter.toml"
    p.write_text(text)
    return p


def test_file_values_and_env_override(tmp_path, monkeypatch):
    p = write(
        tmp_path,
        "[agent]\ninterval_s = 5\nnode_name = 'node7'\n[checks.gpu]\nexpected_count = 8\n",
    )
    monkeypatch.setenv("BABYSITTER_AGENT__INTERVAL_S", "2.5")
    cfg = load_config(p)
    assert cfg.agent.interval_s == 2.5  # env wins over the file
    assert cfg.agent.node_name == "node7"
    assert cfg.checks.gpu.expected_count == 8


def test_unknown_key_is_named(tmp_path):
    p = write(tmp_path, "[policy]\nmax_drained_fractoin = 0.5\n")
    with pytest.raises(ConfigError, match=r"policy\.max_drained_fractoin: unknown key"):
        load_config(p)


def test_bad_value_is_named(tmp_path):
    p = write(tmp_path, "[policy]\nmax_drained_fraction = 7\n")
    with pytest.raises(ConfigError, match=r"policy\.max_drained_fraction"):
        load_config(p)


def test_bad_toml(tmp_path):
    p = write(tmp_path, "[agent\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(p)


def test_cli_reports_bad_key_on_one_line_exit_2(tmp_path):
    p = write(tmp_path, "[slurm]\nbackend = 'carrier-pigeon'\n")
    r = subprocess.run(
        [sys.executable, "-m", "babysitter.cli.main", "--config", str(p), "config", "check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "slurm.backend" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_example_config_is_valid():
    example = Path(__file__).resolve().parents[1] / "systemd" / "babysitter.toml.example"
    cfg = load_config(example)
    assert cfg.slurm.reason_prefix == "babysitter:"


@pytest.mark.parametrize(
    ("toml", "key", "says"),
    [
        ("[checks.sdc]\ndtype = 'bfloat16'\n", "checks.sdc.dtype", "float16"),
        ("[checks.kmsg]\nenabled = false\n", "checks.kmsg", "[checks.xid]"),
        ("[checks.xid]\nactions = {790 = 'reboot'}\n", "checks.xid.actions", "XID 790"),
        ("[checks.xid]\nactions = {79 = 'reboto'}\n", "checks.xid.actions.79", "reset_gpu"),
        ("[checks.gpu]\nprofile = 'H100'\n", "checks.gpu.profile", "agent] hardware_profile"),
        ("[checks.infiniband]\nprofile = 'H100'\n", "checks.infiniband.profile", "hardware"),
        ("[agent]\nhardware_profile = 'h100'\n", "agent.hardware_profile", "h100-sxm"),
        (
            "[checks.gpu]\nthresholds = {temp_warn_margin = 3}\n",
            "checks.gpu.thresholds.temp_warn_margin",
            "unknown key",
        ),
        (
            '[checks.gpu]\nsignal_intervals = {"gpu.memory/sbe_volatile" = 0}\n',
            "checks.gpu.signal_intervals",
            "gpu.memory/sbe_volatile: an interval is seconds > 0",
        ),
        (
            '[checks.gpu]\nsignal_intervals = {"gpu.memory/sbe_volatil" = 30}\n',
            "checks.gpu.signal_intervals",
            "gpu.memory/sbe_volatil is not a signal",
        ),
        ("[agent]\nenabled_checks = ['gpu.memroy']\n", "agent.enabled_checks", "gpu.memroy"),
    ],
)
def test_config_check_refuses_what_the_code_cannot_do(tmp_path, toml, key, says):
    """Values the code would refuse or ignore fail `config check`, naming the key."""
    p = write(tmp_path, toml)
    r = subprocess.run(
        [sys.executable, "-m", "babysitter.cli.main", "--config", str(p), "config", "check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stdout
    line = r.stderr.strip()
    assert f"{key}:" in line and says in line, line
    assert "Traceback" not in r.stderr


def test_xid_overrides_and_profile_that_exist_are_accepted(tmp_path):
    p = write(
        tmp_path,
        "[agent]\nhardware_profile = 'a100-sxm'\n"
        "[checks.xid]\nactions = {13 = 'ignore', 79 = 'inspect'}\n"
        "[checks.gpu]\nthresholds = {temp_warn_margin_c = 8}\n",
    )
    cfg = load_config(p)
    assert cfg.checks.xid.actions == {13: "ignore", 79: "inspect"}
    assert cfg.agent.hardware_profile == "a100-sxm"


def test_env_json_values_typos_and_merge_with_the_file(tmp_path, monkeypatch):
    p = write(tmp_path, "[checks.host]\nmin_free_gb = 7\n[agent]\nnode_name = 'file'\n")
    monkeypatch.setenv("BABYSITTER_CHECKS__HOST__PATHS", '["/a", "/b"]')
    monkeypatch.setenv("babysitter_checks__host__check_slurmd", "false")  # any case
    monkeypatch.setenv("BABYSITTER_CHECKS__XID__ACTIONS", '{"79": "reboot"}')
    monkeypatch.setenv("BABYSITTER_BOGUS", "not a section: ignored")
    cfg = load_config(p)
    assert [str(x) for x in cfg.checks.host.paths] == ["/a", "/b"]
    assert cfg.checks.host.check_slurmd is False
    assert cfg.checks.host.min_free_gb == 7  # the file's key beside the environment's
    assert cfg.checks.xid.actions == {79: "reboot"}
    assert cfg.agent.node_name == "file"
    monkeypatch.setenv("BABYSITTER_AGENT__NODE_NAEM", "typo")
    with pytest.raises(ConfigError, match=r"agent\.node_naem: unknown key"):
        load_config(p)
    monkeypatch.delenv("BABYSITTER_AGENT__NODE_NAEM")
    monkeypatch.setenv("BABYSITTER_CHECKS__HOST__PATHS", "/not/json")
    with pytest.raises(ConfigError, match="BABYSITTER_CHECKS__HOST__PATHS"):
        load_config(p)


@pytest.mark.parametrize(
    ("toml", "line"),
    [
        # what a key expects comes from its type: bounds, choices in the model's order, items
        (
            "[policy]\nmax_drained_fraction = 7\n",
            "policy.max_drained_fraction: expected a number > 0 and <= 1 (got 7)",
        ),
        (
            "[slurm]\nbackend = 'carrier-pigeon'\n",
            "slurm.backend: not one of: cli, rest, pyslurm (got 'carrier-pigeon')",
        ),
        ("[checks.host]\npaths = ['/a', 3]\n", "checks.host.paths[1]: expected a path"),
        ("[checks.xid]\nactions = {abc = 'reboot'}\n", "checks.xid.actions.abc: a key here is an"),
        (
            '[checks.gpu]\nsignal_intervals = {"gpu.memory/sbe_volatile" = "slow"}\n',
            'checks.gpu.signal_intervals."gpu.memory/sbe_volatile": expected a number or one of: '
            "fast (got 'slow')",
        ),
        (
            "[checks.gpu.thresholds]\ntemp_warn_margin = 3\n",
            "checks.gpu.thresholds.temp_warn_margin: unknown key "
            "(did you mean temp_warn_margin_c?)",
        ),
        (
            "[checks.gpu.thresholds]\nretired_pages_max = 'many'\n",
            "checks.gpu.thresholds.retired_pages_max: expected an integer >= 0 (got 'many')",
        ),
        (
            "[checks.sdc]\nresult_timeout_s = 900\n",
            "checks.sdc.result_timeout_s: must be shorter than hold_s (got 900)",
        ),
    ],
)
def test_a_refused_value_is_explained_from_the_keys_type(tmp_path, toml, line):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, toml))
    text = str(err.value)
    assert f"environment): {line}" in text and "\n" not in text, text


def test_an_environment_value_is_explained_like_a_files(tmp_path, monkeypatch):
    monkeypatch.setenv("BABYSITTER_POLICY__MAX_DRAINED_FRACTION", "most")
    monkeypatch.setenv("BABYSITTER_CHECKS__GPU__THRESHOLDS__SBE_VOLATILE_WARN", "20000")
    with pytest.raises(ConfigError, match=r"policy\.max_drained_fraction: expected a number > 0"):
        load_config(write(tmp_path, ""))
    monkeypatch.delenv("BABYSITTER_POLICY__MAX_DRAINED_FRACTION")
    assert load_config(write(tmp_path, "")).checks.gpu.thresholds.sbe_volatile_warn == 20_000


def _keys(model, prefix=()):
    """Every key of every section, nested tables included: (dotted path, is a table)."""
    from babysitter.settings import plain, section_fields, section_model

    for name, ann in section_fields(model).items():
        sub = section_model(plain(ann))
        yield (*prefix, name), sub is not None
        if sub is not None:
            yield from _keys(sub, (*prefix, name))


def test_every_key_given_a_value_of_no_type_of_its_is_named_by_its_error():
    """The explanation walks the models, so no key falls through to msgspec's own text."""
    from babysitter.config import Config, parse_config

    checked = 0
    for path, table in _keys(Config):
        data: dict = {}
        node = data
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = "not a table" if table else [{"bogus": []}]
        with pytest.raises(ConfigError) as err:
            parse_config(data, "x")
        text = str(err.value)
        assert text.startswith(f"invalid configuration in x: {'.'.join(path)}"), text
        assert "expected" in text or "not one of" in text, text
        checked += 1
    assert checked > 100


def test_a_section_check_raising_a_plain_value_error_still_names_its_key():
    """A section added with the older convention (ValueError("<key>: <why>")) keeps one line
    naming the key."""
    from babysitter.config import _convert
    from babysitter.config_errors import explain
    from babysitter.settings import Section

    class Limits(Section):
        low: int = 0
        high: int = 10

        def __post_init__(self) -> None:
            if self.low > self.high:
                raise ValueError("low: above high")

    line = explain({"low": 11}, Limits, _convert, {})
    assert line == "low: above high (got 11)"


def test_the_healthcheck_reads_configs_as_everything_else_does(tmp_path):
    """`babysitter check` imports msgspec without typing_extensions (1.7 MB of its memory,
    cli/check_run.py). The same files must load to the same settings, and a bad one must be
    refused with the same message, as in a process that has typing_extensions."""
    example = Path(__file__).resolve().parents[1] / "systemd" / "babysitter.toml.example"
    bad = write(tmp_path, "[checks.xid]\nactions = {79 = 'reboto'}\n[agent]\ninterval_s = -1\n")
    probe = (
        "import sys\n"
        "from babysitter.cli.check_run import import_msgspec_lean\n"
        "import_msgspec_lean()\n"
        "assert 'typing_extensions' not in sys.modules\n"
        "import msgspec\n"
        "from babysitter.config import load_config\n"
        "from babysitter.errors import ConfigError\n"
        "print(msgspec.json.encode(load_config(sys.argv[1]), enc_hook=str).decode())\n"
        "try:\n"
        "    load_config(sys.argv[2])\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", probe, str(example), str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    settings, refusal = r.stdout.splitlines()[0], "\n".join(r.stdout.splitlines()[1:])
    import msgspec

    assert settings == msgspec.json.encode(load_config(example), enc_hook=str).decode()
    with pytest.raises(ConfigError) as here:
        load_config(bad)
    assert refusal == str(here.value) and "checks.xid.actions.79" in refusal
