"""Checkpoint zoo: many layouts across the formats, every trap, the right choice each time."""

from __future__ import annotations

import io
import json
import os
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from babysitter.checkpoints import find_latest_complete, read_resume_json, write_resume_json

OLD = time.time() - 3600


def zipbytes() -> bytes:
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w") as z:
        z.writestr("archive/data.pkl", b"x" * 2000)
    return b.getvalue()


def safetensors(data_len: int = 16, cut: int = 0) -> bytes:
    """A valid safetensors file (one uint8 tensor), minus `cut` bytes at the end."""
    hdr = json.dumps(
        {"w": {"dtype": "U8", "shape": [data_len], "data_offsets": [0, data_len]}}
    ).encode()
    full = len(hdr).to_bytes(8, "little") + hdr + b"\1" * data_len
    return full[: len(full) - cut]


def put(p: Path, data: bytes = b"weights") -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


def age(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        os.utime(p, (OLD, OLD))


def dcp(root: Path, step: int, complete: bool = True) -> None:
    d = root / f"step{step}"
    put(d / "__0_0.distcp")
    put(d / "__1_0.distcp")
    if complete:
        put(d / ".metadata", b"meta")


def hf(root: Path, step: int, complete: bool = True) -> None:
    d = root / f"checkpoint-{step}"
    put(d / "model.safetensors", safetensors())
    if complete:
        put(d / "trainer_state.json", b"{}")


def generic(root: Path, name: str, complete: bool = True, zero: bool = False) -> None:
    d = root / name
    put(d / "shard0.bin")
    put(d / "shard1.bin", b"" if zero else b"w")
    if complete:
        put(d / ".complete", b"")


Layout = Callable[[Path], None]

ZOO: list[tuple[str, Layout, str | None]] = [
    ("empty dir: fresh start", lambda r: r.mkdir(exist_ok=True), None),
    ("dcp one complete", lambda r: dcp(r, 100), "step100"),
    (
        "dcp newer incomplete beside older complete",
        lambda r: (dcp(r, 100), dcp(r, 200, complete=False)),
        "step100",
    ),
    ("dcp three complete picks newest", lambda r: [dcp(r, s) for s in (1, 2, 3)], "step3"),
    ("dcp only incomplete", lambda r: dcp(r, 5, complete=False), None),
    (
        "deepspeed latest ok",
        lambda r: (
            put(r / "global_step1200" / "mp_rank_00_model_states.pt", zipbytes()),
            put(r / "latest", b"global_step1200"),
        ),
        "global_step1200",
    ),
    (
        "deepspeed latest points nowhere",
        lambda r: (
            put(r / "global_step100" / "x.pt", zipbytes()),
            put(r / "latest", b"global_step200"),
        ),
        None,
    ),
    (
        "deepspeed zero-size shard",
        lambda r: (put(r / "global_step5" / "a.pt", b""), put(r / "latest", b"global_step5")),
        None,
    ),
    (
        "deepspeed truncated shard",
        lambda r: (
            put(r / "global_step5" / "a.pt", zipbytes()[:50]),
            put(r / "latest", b"global_step5"),
        ),
        None,
    ),
    (
        "megatron ok",
        lambda r: (
            put(r / "iter_0001200" / "mp_rank_00" / "model_optim_rng.pt", zipbytes()),
            put(r / "latest_checkpointed_iteration.txt", b"1200"),
        ),
        "iter_0001200",
    ),
    (
        "megatron tracker ahead of disk",
        lambda r: (
            put(r / "iter_0001000" / "m.pt", zipbytes()),
            put(r / "latest_checkpointed_iteration.txt", b"2000"),
        ),
        "iter_0001000",  # the tracker names a missing iteration: the newest older one
    ),
    (
        "megatron release",
        lambda r: (
            put(r / "release" / "m.pt", zipbytes()),
            put(r / "latest_checkpointed_iteration.txt", b"release"),
        ),
        "release",
    ),
    ("hf complete", lambda r: hf(r, 500), "checkpoint-500"),
    (
        "hf newer without trainer_state",
        lambda r: (hf(r, 500), hf(r, 1000, complete=False)),
        "checkpoint-500",
    ),
    ("hf numeric not lexical order", lambda r: (hf(r, 900), hf(r, 1000)), "checkpoint-1000"),
    (
        "lightning ckpts",
        lambda r: (
            put(r / "epoch=1-step=100.ckpt", zipbytes()),
            put(r / "epoch=2-step=200.ckpt", zipbytes()),
        ),
        "epoch=2-step=200.ckpt",
    ),
    (
        "lightning truncated newest",
        lambda r: (
            put(r / "epoch=1-step=100.ckpt", zipbytes()),
            put(r / "epoch=2-step=200.ckpt", zipbytes()[:30]),
        ),
        "epoch=1-step=100.ckpt",
    ),
    ("lightning zero-size", lambda r: put(r / "epoch=3-step=300.ckpt", b""), None),
    (
        "lightning last.ckpt wins",
        lambda r: (put(r / "epoch=1-step=100.ckpt", zipbytes()), put(r / "last.ckpt", zipbytes())),
        "last.ckpt",
    ),
    ("generic marker", lambda r: (generic(r, "step1"), generic(r, "step2")), "step2"),
    (
        "generic newer without marker",
        lambda r: (generic(r, "step3"), generic(r, "step4", complete=False)),
        "step3",
    ),
    (
        "generic zero-size shard",
        lambda r: (generic(r, "step3"), generic(r, "step4", zero=True)),
        "step3",
    ),
    ("temp dir name", lambda r: (generic(r, "step3"), generic(r, "step4.tmp")), "step3"),
    (
        "babysitter state dir ignored",
        lambda r: (generic(r, "step3"), put(r / ".babysitter" / "resume.json", b"{}")),
        "step3",
    ),
]


@pytest.mark.parametrize("name,layout,expected", ZOO, ids=[z[0] for z in ZOO])
def test_zoo(tmp_path, name, layout, expected):
    root = tmp_path / "ckpt"
    root.mkdir()
    layout(root)
    age(root)
    choice = find_latest_complete(root, settle_s=30)
    if expected is None:
        assert choice is None, choice and choice.explanation
    else:
        assert choice is not None, name
        assert choice.path.name == expected, choice.explanation
        assert choice.explanation


def test_zoo_is_big_enough():
    assert len(ZOO) >= 20


def test_directory_still_being_written_is_skipped(tmp_path):
    root = tmp_path / "ckpt"
    generic(root, "step1")
    age(root)
    d = root / "step2"
    put(d / "shard0.bin")  # just now, no marker yet
    choice = find_latest_complete(root, settle_s=30)
    assert choice is not None and choice.path.name == "step1"
    assert "step2" in choice.explanation


def test_resume_json_roundtrip_is_atomic(tmp_path):
    root = tmp_path / "ckpt"
    generic(root, "step3")
    age(root)
    choice = find_latest_complete(root)
    assert choice is not None
    p = write_resume_json(root, choice, job_id=7, restart_count=1)
    doc = read_resume_json(root)
    assert doc is not None and doc["path"] == str(root / "step3") and doc["job_id"] == 7
    assert [f.name for f in p.parent.iterdir()] == ["resume.json"]  # no temp files left
