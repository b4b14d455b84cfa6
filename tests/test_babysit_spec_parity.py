"""The SPANK plugin (slurm-plugins/babysit_spank.c) and babysitter.job.parse_babysit_args read
`--babysit` values alike: the plugin's own parse, compiled alone, and the Python parser are fed
the same generated specs (keys, digits of every script, ASCII and Unicode whitespace anywhere,
paths near and past the length limits) and must agree on accepting each one, and on the ckpt
the job gets (the plugin's BABYSIT_CKPT) and the controller reads from AdminComment. They
disagreed on trailing or ideographic whitespace and on a long `ckpt=` path."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from babysitter.job import BabysitArgsError, babysit_spec, parse_babysit_args

SOURCE = Path(str(files("babysitter.slurm_plugins"))) / "babysit_spank.c"

HARNESS = r"""
#define BABYSIT_PARSE_ONLY
#include "babysit_spank.c"
/* NUL-terminated specs on stdin; for each: "A<ckpt>\0" (accepted) or "R\0" (refused) */
int main(void) {
    static char spec[1 << 20];
    size_t n = 0;
    int c;
    while ((c = getchar()) != EOF) {
        if (c) { if (n + 1 < sizeof spec) spec[n++] = (char)c; continue; }
        spec[n] = 0;
        n = 0;
        struct babysit_spec out;
        char err[256];
        if (parse(spec, &out, err, sizeof err) == 0) printf("A%s", out.ckpt);
        else printf("R");
        putchar(0);
        fflush(stdout);
    }
    return 0;
}
"""


class Plugin:
    """The plugin's parse in a process of its own, asked one spec at a time."""

    def __init__(self, exe: Path) -> None:
        self.proc = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def parse(self, value: str) -> str | None:
        """The ckpt ("" without one) when the plugin accepts `value`, None when it refuses."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(value.encode() + b"\0")
        self.proc.stdin.flush()
        out = bytearray()
        while (b := self.proc.stdout.read(1)) != b"\0":
            assert b, "the harness died"
            out += b
        return out[1:].decode() if out[:1] == b"A" else None

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plugin]:
    d = tmp_path_factory.mktemp("spank-parse")
    shutil.copy(SOURCE, d / "babysit_spank.c")
    (d / "harness.c").write_text(HARNESS)
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler (make setup installs gcc)"
    subprocess.run(
        [cc, "-O1", "-Wall", "-Werror", "-o", str(d / "harness"), str(d / "harness.c")],
        check=True,
        cwd=d,
        timeout=120,
    )
    p = Plugin(d / "harness")
    yield p
    p.close()


def python_parse(value: str) -> str | None:
    """What the controller reads from AdminComment `babysit=<value>` (job_submit.lua)."""
    try:
        spec = parse_babysit_args(f"babysit={value}" if value else "babysit")
    except BabysitArgsError:
        return None
    # the controller finds the spec in AdminComment the same way
    assert babysit_spec(f"babysit={value}" if value else "babysit") == spec
    return spec.get("ckpt", "")


SPACES = [" ", "\t", "\n", "\v", "\f", "\r", "\x1c", "\x85", "\xa0", "\u1680", "\u2003",
          "\u2028", "\u202f", "\u205f", "\u3000"]  # fmt: skip
# text a path may hold: ASCII, accents, CJK, emoji, and every kind of whitespace
path_char = st.one_of(
    st.sampled_from("abc/._-=0"),
    st.sampled_from(SPACES),
    st.characters(codec="utf-8", exclude_characters="\x00,", exclude_categories=("Cs",)),
)
number = st.one_of(
    st.integers(0, 10**9).map(str),
    st.sampled_from(["", "²", "١٢", "٣", "0x1", "-1", "1e3", "000000001", "00000000001"]),
)
path = st.one_of(
    st.text(path_char, max_size=40).map(lambda p: "/" + p),
    st.text(path_char, max_size=20),  # relative
    # near the limits: 4095 bytes is the longest path, 8191 the longest value
    st.builds(
        lambda n, tail: "/" + "d" * n + tail,
        st.integers(4000, 8300),
        st.text(path_char, max_size=3),
    ),
)


@st.composite
def specs(draw: st.DrawFn) -> str:
    parts = []
    for _ in range(draw(st.integers(0, 4))):
        key = draw(st.sampled_from(["ckpt", "max_requeues", "hang_timeout", "colour", "", "CKPT"]))
        value = draw(path if key in ("ckpt", "CKPT") else number)
        sep = draw(st.sampled_from(["=", "=", "=", "", "=="]))
        parts.append(key + sep + value)
    joined = draw(st.sampled_from([",", ",", ",,", ", "]))
    text = joined.join(parts)
    if draw(st.booleans()):  # whitespace or junk around it or inside it
        pad = draw(st.text(st.sampled_from([*SPACES, ","]), max_size=3))
        at = draw(st.sampled_from(["start", "end", "both"]))
        text = (pad if at != "end" else "") + text + (pad if at != "start" else "")
    return text


# bounded by examples, never by a clock (deadline=None); long paths are the point, not a
# health problem
@settings(
    max_examples=600,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)
@given(value=specs())
def test_plugin_and_python_parse_every_spec_alike(plugin, value):
    assert plugin.parse(value) == python_parse(value), repr(value[:200])


@pytest.mark.parametrize(
    "value",
    [
        "ckpt=/lustre/run1 ",  # trailing whitespace
        " ckpt=/lustre/run1",
        "max_requeues=3\u3000",  # ideographic space
        "ckpt=/lustre/run\u30001",
        "ckpt=/lustre/run1,\u3000max_requeues=3",
        "ckpt=/a b",
        "ckpt=/" + "p" * 4094,  # the longest path: 4095 bytes
        "ckpt=/" + "p" * 4095,
        "ckpt=/" + "é" * 2047,  # 4095 bytes in 2048 characters
        "ckpt=/" + "é" * 2048,
        "ckpt=/" + "p" * 1100,  # past the plugin's old 1,024-byte buffer
        "ckpt=/x,max_requeues=3,hang_timeout=1800",
        "",
    ],
)
def test_the_cases_that_disagreed(plugin, value):
    assert plugin.parse(value) == python_parse(value)
