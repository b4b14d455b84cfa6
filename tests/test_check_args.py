"""`babysitter check` reads a plain command line (what slurm.conf's HealthCheckProgram holds)
without argparse, whose import costs the one-shot more memory than its checks: that reading
must give exactly what argparse gives, and leave everything else (help, typos, -vv) to
argparse."""

from __future__ import annotations

import pytest

from babysitter.cli.check_run import _parser, simple_args

PLAIN = [
    ["check"],
    ["check", "--json"],
    ["check", "--slurm-drain"],
    ["--config", "/etc/babysitter/b.toml", "check", "--only", "gpu,xid", "--slurm-drain"],
    ["--config=/etc/b.toml", "-v", "check", "--only=gpu"],
    ["-v", "--verbose", "check", "--json", "--slurm-drain"],
]
OTHER = [
    ["check", "-v"],
    ["check", "--help"],
    ["check", "--only"],
    ["check", "--config", "x"],
    ["--only", "gpu", "check"],
    ["check", "--json", "--json"],
    ["check", "--jso"],
    ["-vv", "check"],
    ["check", "--only", "-x"],
    ["--config", "x"],
]


@pytest.mark.parametrize("argv", PLAIN, ids=" ".join)
def test_a_plain_command_line_reads_as_argparse_reads_it(argv):
    fast = simple_args(argv)
    assert fast is not None
    assert vars(fast) == vars(_parser().parse_args(argv))


@pytest.mark.parametrize("argv", OTHER, ids=" ".join)
def test_anything_else_is_left_to_argparse(argv):
    assert simple_args(argv) is None
