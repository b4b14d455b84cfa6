"""Checkpoint zoo: many layouts across the formats, every trap, the right choice each time."""

from __future__ import annotations

import contextlib
import io
import json
import os
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from babysitter.checkpoints import (
    find_latest_complete,
    owner,
    read_resume_json,
    write_resume_json,
)
from babysitter.checkpoints.discover import discover
from babysitter.checkpoints.safefs import Budget, Refused

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
        os.utime(p, (OLD, OLD), follow_symlinks=False)


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


def ds_step(root: Path, step: int) -> None:
    put(root / f"global_step{step}" / "mp_rank_00_model_states.pt", zipbytes())
    put(root / f"global_step{step}" / "zero_pp_rank_0_mp_rank_00_optim_states.pt", zipbytes())


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
    # ---- issue #15: the framework's pointer, fallback, format-aware completeness
    (
        "deepspeed tag dir with a stray file only",
        lambda r: (put(r / "global_step5" / "notes.txt"), put(r / "latest", b"global_step5")),
        None,
    ),
    (
        "deepspeed pointed-to incomplete falls back to the newest older complete",
        lambda r: (
            ds_step(r, 1),
            ds_step(r, 2),
            put(r / "global_step3" / "mp_rank_00_model_states.pt", zipbytes()[:100]),
            put(r / "latest", b"global_step3"),
        ),
        "global_step2",
    ),
    (
        "deepspeed dir newer than latest is still being written",
        lambda r: (ds_step(r, 2), ds_step(r, 3), put(r / "latest", b"global_step2")),
        "global_step2",
    ),
    (
        "deepspeed latest names a missing tag: older one",
        lambda r: (ds_step(r, 2), put(r / "latest", b"global_step3")),
        "global_step2",
    ),
    (
        "megatron pointed-to truncated falls back",
        lambda r: (
            put(r / "iter_0000002" / "mp_rank_00" / "model_optim_rng.pt", zipbytes()),
            put(r / "iter_0000003" / "mp_rank_00" / "model_optim_rng.pt", zipbytes()[:-30]),
            put(r / "latest_checkpointed_iteration.txt", b"3"),
        ),
        "iter_0000002",
    ),
    (
        "megatron distributed checkpoint",
        lambda r: (
            put(r / "iter_0000007" / ".metadata", b"meta"),
            put(r / "iter_0000007" / "__0_0.distcp"),
            put(r / "latest_checkpointed_iteration.txt", b"7\n"),
        ),
        "iter_0000007",
    ),
    (
        "hf truncated safetensors falls back",
        lambda r: (
            hf(r, 100),
            put(r / "checkpoint-200" / "model.safetensors", safetensors(cut=5)),
            put(r / "checkpoint-200" / "trainer_state.json", b"{}"),
        ),
        "checkpoint-100",
    ),
    (
        "hf safetensors with trailing garbage",
        lambda r: (
            hf(r, 100),
            put(r / "checkpoint-200" / "model.safetensors", safetensors() + b"xx"),
            put(r / "checkpoint-200" / "trainer_state.json", b"{}"),
        ),
        "checkpoint-100",
    ),
    (
        "hf index names a missing shard",
        lambda r: (
            hf(r, 100),
            put(r / "checkpoint-200" / "model-00001-of-00002.safetensors", safetensors()),
            put(
                r / "checkpoint-200" / "model.safetensors.index.json",
                json.dumps(
                    {
                        "weight_map": {
                            "a": "model-00001-of-00002.safetensors",
                            "b": "model-00002-of-00002.safetensors",
                        }
                    }
                ).encode(),
            ),
            put(r / "checkpoint-200" / "trainer_state.json", b"{}"),
        ),
        "checkpoint-100",
    ),
    (
        "hf truncated pytorch_model.bin",
        lambda r: (
            hf(r, 100),
            put(r / "checkpoint-200" / "pytorch_model.bin", zipbytes()[:-10]),
            put(r / "checkpoint-200" / "trainer_state.json", b"{}"),
        ),
        "checkpoint-100",
    ),
    (
        "generic with a truncated .pt",
        lambda r: (
            generic(r, "step1"),
            put(r / "step2" / "model.pt", zipbytes()[:-1]),
            put(r / "step2" / ".complete", b""),
        ),
        "step1",
    ),
    (
        "dcp empty .metadata",
        lambda r: (
            dcp(r, 1),
            put(r / "step2" / "__0_0.distcp"),
            put(r / "step2" / ".metadata", b""),
        ),
        "step1",
    ),
    (
        "lightning dangling last.ckpt link",
        lambda r: (
            put(r / "epoch=1-step=100.ckpt", zipbytes()),
            (r / "last.ckpt").symlink_to("epoch=2-step=200.ckpt"),
        ),
        "epoch=1-step=100.ckpt",
    ),
    (
        "lightning last.ckpt link followed inside the directory",
        lambda r: (
            put(r / "epoch=1-step=100.ckpt", zipbytes()),
            put(r / "epoch=2-step=200.ckpt", zipbytes()),
            (r / "last.ckpt").symlink_to("epoch=2-step=200.ckpt"),
        ),
        "epoch=2-step=200.ckpt",
    ),
    # ---- issue #14: hostile directories never steer discovery out of ckpt or stop it
    ("latest names ..", lambda r: (generic(r, "step1"), put(r / "latest", b"..")), "step1"),
    ("latest names /etc", lambda r: (generic(r, "step1"), put(r / "latest", b"/etc")), "step1"),
    (
        "links to /etc",
        lambda r: (
            generic(r, "step1"),
            (r / "step9").symlink_to("/etc"),
            (r / "etc").symlink_to("/etc"),
            (r / "step8").symlink_to("../../../../../../../etc"),
        ),
        "step1",
    ),
    (
        "symlink loop",
        lambda r: (generic(r, "step1"), (r / "a").symlink_to("b"), (r / "b").symlink_to("a")),
        "step1",
    ),
    (
        "link inside a checkpoint to /etc/shadow",
        lambda r: (
            generic(r, "step1"),
            (r / "step1" / "shadow").symlink_to("/etc/shadow"),
        ),
        "step1",
    ),
    (
        "FIFO as DeepSpeed latest",
        lambda r: (generic(r, "step1"), os.mkfifo(r / "latest")),
        "step1",
    ),
    (
        "FIFO inside a checkpoint",
        lambda r: (generic(r, "step1"), generic(r, "step2"), os.mkfifo(r / "step2" / "pipe")),
        "step1",
    ),
    (
        "1 MB tracker",
        lambda r: (
            generic(r, "step1"),
            put(r / "iter_0000001" / "m.pt", zipbytes()),
            put(r / "latest_checkpointed_iteration.txt", b"1" * 1_000_000),
        ),
        "step1",
    ),
    (
        "tracker of non-ASCII digits",
        lambda r: (
            generic(r, "step1"),
            put(r / "latest_checkpointed_iteration.txt", "²".encode()),
        ),
        "step1",
    ),
    (
        "tracker of 5000 digits",
        lambda r: (
            generic(r, "step1"),
            put(r / "latest_checkpointed_iteration.txt", b"9" * 5000),
        ),
        "step1",
    ),
    (
        "non-ASCII digits in names",
        lambda r: (generic(r, "step1"), generic(r, "step\u0663"), generic(r, "step\u00b2")),
        "step1",
    ),
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
    assert len(ZOO) >= 45


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


@pytest.mark.parametrize(
    "layout",
    [
        lambda r: (ds_step(r, 1), ds_step(r, 7), put(r / "latest", b"global_step7")),
        lambda r: (
            put(r / "iter_0000007" / "mp_rank_00" / "model_optim_rng.pt", zipbytes()),
            put(r / "latest_checkpointed_iteration.txt", b"7"),
        ),
    ],
    ids=["deepspeed", "megatron"],
)
def test_pointer_marks_completion_even_moments_after_the_write(tmp_path, layout):
    """The pointer is written last: a checkpoint it names is complete however fresh it is."""
    root = tmp_path / "ckpt"
    root.mkdir()
    layout(root)  # not aged: everything was modified just now
    choice = find_latest_complete(root, settle_s=30)
    assert choice is not None and choice.step == 7, choice and choice.explanation
    assert "written last by the framework" in choice.explanation


def test_hostile_entries_are_skipped_with_reasons(tmp_path):
    root = tmp_path / "ckpt"
    generic(root, "step1")
    (root / "etc").symlink_to("/etc")
    (root / "a").symlink_to("b")
    (root / "b").symlink_to("a")
    (root / "gone.ckpt").symlink_to("nowhere.ckpt")
    put(root / "latest_checkpointed_iteration.txt", b"1" * 1_000_000)
    age(root)
    scan = discover(root)
    choice = scan.choice()
    assert choice is not None and choice.path.name == "step1"
    text = choice.explanation
    assert "etc -> /etc leaves the checkpoint directory" in text
    assert "gone.ckpt: dangling link" in text
    assert any("a symbolic link" in s or "link to a link" in s for s in scan.skipped), scan.skipped
    assert "latest_checkpointed_iteration.txt is 1000000 bytes, over the 4096-byte cap" in text


def test_pointer_refusals_are_explained(tmp_path):
    root = tmp_path / "ckpt"
    generic(root, "step1")
    put(root / "latest", b"../../etc")
    put(root / "latest_checkpointed_iteration.txt", "²".encode())
    age(root)
    choice = find_latest_complete(root)
    assert choice is not None and choice.path.name == "step1"
    assert "`latest` names '../../etc': refused" in choice.explanation
    assert "holds '²': not a number of at most 12 ASCII digits" in choice.explanation


def test_many_stray_files_beside_a_complete_checkpoint_cost_no_budget(tmp_path):
    """Issue 42: 300 log files beside the checkpoints, budget 100 entries: the walk used to
    give up on the listing and the job restarted from scratch. Names are listed first; only
    what can be a checkpoint is examined."""
    root = tmp_path / "ckpt"
    for i in range(300):
        put(root / f"events.out.tfevents.{i}", b"log")
    dcp(root, 9)
    dcp(root, 10)
    age(root)
    scan = discover(root, budget=Budget(max_entries=100))
    choice = scan.choice()
    assert choice is not None and choice.path.name == "step10", scan.explain_none()
    assert not scan.gave_up and not scan.unknown and choice.warning == ""


def test_a_newer_sharded_checkpoint_is_found_past_many_older_ones(tmp_path):
    """Issue 42: more checkpoint directories than the budget: the newest complete (sharded)
    one is examined first and wins; what the budget did not reach is older."""
    root = tmp_path / "ckpt"
    for s in range(1, 151):
        dcp(root, s)
    for i in range(60):
        put(root / "step200" / f"__{i}_0.distcp")
    put(root / "step200" / ".metadata", b"m")
    age(root)
    scan = discover(root, budget=Budget(max_entries=100))
    choice = scan.choice()
    assert choice is not None and choice.path.name == "step200", scan.explain_none()
    assert choice.warning == "" and not scan.unknown  # older ones cannot be newer


def test_a_budget_that_runs_out_before_anything_is_verified_says_unknown(tmp_path):
    """300 unfinished checkpoint directories, budget 100: nothing verified, the older 200 not
    examined: "unknown", never "no complete checkpoint" (a silent fresh start)."""
    root = tmp_path / "ckpt"
    for s in range(300):
        put(root / f"step{s}" / "shard.bin")
    age(root)
    scan = discover(root, budget=Budget(max_entries=100))
    assert scan.choice() is None and scan.unknown
    assert scan.explain_none().startswith("UNKNOWN: the discovery budget ran out")
    assert "200 entries not examined" in scan.explain_none()


def test_a_candidate_too_big_to_check_is_unknown_and_the_fallback_says_so(tmp_path):
    """Two newer checkpoints each exhaust their own entry budget: their completeness is
    unknown (not "incomplete"). The job resumes from the newest VERIFIED one, and the choice
    carries a warning naming what could not be verified (docs/jobs.md)."""
    root = tmp_path / "ckpt"
    generic(root, "step1")
    for step in (2, 3):
        for i in range(150):
            put(root / f"step{step}" / f"shard{i}.bin")
        put(root / f"step{step}" / ".complete", b"")
    age(root)
    scan = discover(root, budget=Budget(max_entries=100))
    choice = scan.choice()
    assert choice is not None and choice.path.name == "step1", scan.explain_none()
    assert scan.unknown and choice.warning.startswith("newer checkpoint(s) could not be verified")
    assert "step3 (not verified: gave up: 101 entries" in choice.warning
    assert "step2 (not verified: gave up: 101 entries" in choice.warning
    assert choice.explanation.startswith("WARNING: ") and choice.to_dict()["warning"]


def test_the_requeue_records_unknown_not_a_fresh_start(tmp_path, monkeypatch):
    """What the job owner's helper answers the controller: unknown, so the requeue's record
    says "resume point unknown", not "restarts from scratch"."""
    import babysitter.checkpoints.discover as disc
    from babysitter.checkpoints import owner

    root = tmp_path / "ckpt"
    for s in range(300):
        put(root / f"step{s}" / "shard.bin")
    age(root)
    monkeypatch.setattr(disc, "Budget", lambda: Budget(max_entries=100))
    doc = owner._discover({"ckpt": str(root)})
    assert doc["ok"] is True and doc["choice"] is None and doc["unknown"] is True
    assert doc["explanation"].startswith("UNKNOWN")


@pytest.mark.parametrize(
    "index",
    [
        b"[]",
        b'"model-00001-of-00001.safetensors"',
        b"{}",
        b'{"weight_map": []}',
        b'{"weight_map": {}}',
        b'{"weight_map": {"a": ["model-00001-of-00001.safetensors"]}}',
        b"{not json",
    ],
)
def test_a_sharded_weights_index_that_cannot_be_read_means_incomplete(tmp_path, index):
    root = tmp_path / "ckpt"
    hf(root, 100)
    put(root / "checkpoint-200" / "model-00001-of-00001.safetensors", safetensors())
    put(root / "checkpoint-200" / "model.safetensors.index.json", index)
    put(root / "checkpoint-200" / "trainer_state.json", b"{}")
    age(root)
    choice = discover(root).choice()
    assert choice is not None and choice.path.name == "checkpoint-100"
    assert "checkpoint-200 (model.safetensors.index.json is not" in choice.explanation


def test_old_checkpoints_do_not_spend_the_walk_budget(tmp_path):
    """Contents are read newest first: 40 kept checkpoints of 50 files each fit a budget of
    200 entries, because only the newest complete one is read."""
    root = tmp_path / "ckpt"
    for s in range(1, 41):
        for i in range(50):
            put(root / f"step{s}" / f"__{i}_0.distcp")
        put(root / f"step{s}" / ".metadata", b"m")
    age(root)
    scan = discover(root, budget=Budget(max_entries=200))
    choice = scan.choice()
    assert not scan.gave_up and choice is not None and choice.path.name == "step40"


def test_files_vanishing_mid_scan_never_abort_discovery(tmp_path):
    """A writer creates and deletes files and directories while discovery runs: each run
    finishes and still picks the complete checkpoint."""
    root = tmp_path / "ckpt"
    generic(root, "step1")
    age(root)
    stop = threading.Event()

    def churn() -> None:
        i = 0
        while not stop.is_set():
            d = root / f"step{2 + i % 3}"
            for name in ("a.bin", "b.pt", ".complete"):
                with contextlib.suppress(OSError):
                    put(d / name, b"x")
            with contextlib.suppress(OSError):
                (root / f"last{i % 2}.ckpt").symlink_to(f"gone{i}.ckpt")
            for p in list(d.glob("*")):
                with contextlib.suppress(OSError):
                    p.unlink()
            with contextlib.suppress(OSError):
                d.rmdir()
            with contextlib.suppress(OSError):
                (root / f"last{i % 2}.ckpt").unlink()
            i += 1

    t = threading.Thread(target=churn)
    t.start()
    try:
        for _ in range(300):
            choice = find_latest_complete(root)
            assert choice is not None  # step1 always, or a churned step that was complete
    finally:
        stop.set()
        t.join()


def test_resume_json_never_written_through_a_link(tmp_path):
    root = tmp_path / "ckpt"
    generic(root, "step3")
    other = tmp_path / "other" / ".babysitter"
    other.mkdir(parents=True)
    (root / ".babysitter").symlink_to(other)
    choice = find_latest_complete(root)
    assert choice is not None
    with pytest.raises(Refused, match="symbolic link"):
        write_resume_json(root, choice, job_id=7, restart_count=1)
    assert list(other.iterdir()) == []


@pytest.mark.parametrize("name", ["run-é-日本-🚀", os.fsdecode(b"run-\xff\xfe-latin1-\xe9")])
def test_resume_json_keeps_any_path_exactly(tmp_path, name):
    root = tmp_path / name
    generic(root, "step3")
    choice = find_latest_complete(root)
    assert choice is not None
    p = write_resume_json(root, choice, job_id=7, restart_count=1)
    p.read_bytes().decode("ascii")  # ASCII JSON: \u escapes, surrogateescape bytes as \udcXX
    doc = read_resume_json(root)
    assert doc is not None and os.fsencode(doc["path"]) == os.fsencode(root / "step3")


# ---- the helper process (as this process's user here; as real users in test_users_ckpt.py)


def test_helper_prepares_resume_and_reads_a_fifo_heartbeat_without_blocking(tmp_path):
    root = tmp_path / "ckpt"
    generic(root, "step3")
    age(root)
    out = owner.prepare_resume(str(root), None, 7, 1, settle_s=10)
    assert out.resume_point == str(root / "step3") and out.step == 3
    assert read_resume_json(root)["path"] == str(root / "step3")  # type: ignore[index]
    os.mkfifo(root / ".babysitter" / "heartbeat-7.json")
    age_s = owner.heartbeat_age(str(root), None, 7, OLD + 3600 + 100)
    assert age_s is not None  # fell back to the newest file: the FIFO was refused, not read


def test_helper_answers_for_a_missing_dir_and_an_unknown_owner(tmp_path):
    out = owner.prepare_resume(str(tmp_path / "none"), None, 7, 1, settle_s=10)
    assert out.resume_point is None and "no complete checkpoint" in out.explanation
    out = owner.prepare_resume(str(tmp_path), "no-such-user-xyz", 7, 1, settle_s=10)
    assert out.resume_point is None and "unknown" in out.explanation


def test_helper_wall_time_limit_kills_it(tmp_path):
    with pytest.raises(owner.HelperError, match="timed out"):
        owner.run_helper({"op": "discover", "ckpt": str(tmp_path)}, None, wall_s=0.001)
