"""Checkpoint discovery.

Formats and how a complete one is recognised (shared notes: domain.md):
- PyTorch DCP: a directory holding `.metadata` (the coordinator writes it last).
- DeepSpeed: `latest` names a tag directory (e.g. `global_step1200`) that exists and holds files.
- Megatron-LM: `latest_checkpointed_iteration.txt` (a number or `release`) and `iter_NNNNNNN/`.
- Hugging Face Trainer: `checkpoint-<step>/` with `trainer_state.json`.
- Lightning / NeMo: `*.ckpt` files (torch zip archives; a truncated one fails zip validation).
- Generic: `<dir>/<name>/` with a `.complete` marker (what `babysitter.job.mark_checkpoint_complete`
  writes, last).

Never picked: a directory still being written (a temp name, or modified within `settle_s`), a
zero-size shard, a truncated zip, a pointer to a missing directory, a newer-but-incomplete step
beside an older complete one (the older one wins).
"""

from __future__ import annotations

import json
import re
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

MARKER = ".complete"
_TMP_RE = re.compile(r"(\.tmp|\.partial|\.incomplete|~)$|^(tmp|\.tmp)", re.I)
_STEP_RE = re.compile(r"(\d+)")


@dataclass
class Candidate:
    path: Path
    format: str
    step: int
    complete: bool
    why: str


@dataclass
class Choice:
    path: Path
    format: str
    step: int
    explanation: str
    rejected: list[Candidate] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "format": self.format,
            "step": self.step,
            "explanation": self.explanation,
            "rejected": [{"path": str(c.path), "why": c.why} for c in self.rejected],
        }


def _step(name: str) -> int:
    nums = _STEP_RE.findall(name)
    return int(nums[-1]) if nums else -1


def _recent(p: Path, settle_s: float, now: float) -> bool:
    """Anything under p modified within settle_s: probably still being written."""
    try:
        newest = max((q.stat().st_mtime for q in [p, *p.rglob("*")]), default=0.0)
    except OSError:
        return True
    return now - newest < settle_s


def _files_ok(d: Path) -> tuple[bool, str]:
    files = [f for f in d.rglob("*") if f.is_file()]
    if not files:
        return False, "empty directory"
    zero = [
        f
        for f in files
        if f.stat().st_size == 0 and f.name != MARKER and not f.name.startswith(".")
    ]
    if zero:
        return False, f"zero-size shard {zero[0].name}"
    for f in files:
        if f.suffix in (".ckpt", ".pt", ".pth") and not _zip_ok(f):
            return False, f"truncated archive {f.name}"
    return True, "all shards present"


def _zip_ok(f: Path) -> bool:
    try:
        if not zipfile.is_zipfile(f):
            return False
        with zipfile.ZipFile(f) as z:
            return z.testzip() is None
    except (OSError, zipfile.BadZipFile, EOFError):
        return False


def _dir_candidate(
    d: Path, fmt: str, step: int, need: str | None, settle_s: float, now: float
) -> Candidate:
    if _TMP_RE.search(d.name):
        return Candidate(d, fmt, step, False, "temporary name: still being written")
    if need and not (d / need).exists():
        return Candidate(d, fmt, step, False, f"no {need}: not finished")
    ok, why = _files_ok(d)
    if not ok:
        return Candidate(d, fmt, step, False, why)
    if _recent(d, settle_s, now) and not (need and (d / need).exists()):
        return Candidate(d, fmt, step, False, "modified moments ago: still being written")
    return Candidate(d, fmt, step, True, f"{need or 'files'} present; {why}")


def candidates(root: Path, settle_s: float = 0.0, now: float | None = None) -> list[Candidate]:
    now = time.time() if now is None else now
    out: list[Candidate] = []
    if not root.is_dir():
        return out
    entries = sorted(p for p in root.iterdir() if not p.name.startswith(".babysitter"))

    # DeepSpeed: `latest` names the tag
    latest = root / "latest"
    if latest.is_file():
        tag = latest.read_text(errors="replace").strip()
        d = root / tag
        if not tag or "/" in tag or not d.is_dir():
            out.append(
                Candidate(
                    d,
                    "deepspeed",
                    _step(tag),
                    False,
                    f"`latest` points to {tag!r}, which does not exist",
                )
            )
        else:
            out.append(_dir_candidate(d, "deepspeed", _step(tag), None, settle_s, now))
    # Megatron-LM
    tracker = root / "latest_checkpointed_iteration.txt"
    if tracker.is_file():
        it = tracker.read_text(errors="replace").strip()
        name = "release" if it == "release" else (f"iter_{int(it):07d}" if it.isdigit() else "")
        d = root / name if name else root / "?"
        if not name or not d.is_dir():
            out.append(
                Candidate(
                    d,
                    "megatron",
                    _step(it),
                    False,
                    f"tracker says {it!r} but {d.name} does not exist",
                )
            )
        else:
            out.append(_dir_candidate(d, "megatron", _step(it), None, settle_s, now))
    for p in entries:
        if p.is_dir():
            if (p / ".metadata").exists() or (
                p.name.startswith("step")
                and not any((p / n).exists() for n in ("trainer_state.json", MARKER))
            ):
                out.append(
                    _dir_candidate(p, "torch_dcp", _step(p.name), ".metadata", settle_s, now)
                )
            elif p.name.startswith("checkpoint-"):
                out.append(
                    _dir_candidate(
                        p, "hf_trainer", _step(p.name), "trainer_state.json", settle_s, now
                    )
                )
            elif (p / MARKER).exists():
                out.append(_dir_candidate(p, "generic", _step(p.name), MARKER, settle_s, now))
            elif re.match(r"iter_\d+$", p.name) and not tracker.is_file():
                out.append(
                    Candidate(
                        p,
                        "megatron",
                        _step(p.name),
                        False,
                        "no latest_checkpointed_iteration.txt names it",
                    )
                )
            elif p.name.startswith("global_step") and not latest.is_file():
                out.append(
                    Candidate(p, "deepspeed", _step(p.name), False, "no `latest` file names it")
                )
            elif _STEP_RE.search(p.name) and p.name not in {c.path.name for c in out}:
                out.append(
                    Candidate(
                        p, "generic", _step(p.name), False, f"no completion marker ({MARKER})"
                    )
                )
        elif p.suffix == ".ckpt":
            if _TMP_RE.search(p.name):
                out.append(Candidate(p, "lightning", _step(p.stem), False, "temporary name"))
            elif p.stat().st_size == 0 or not _zip_ok(p):
                out.append(
                    Candidate(p, "lightning", _step(p.stem), False, "truncated or invalid archive")
                )
            elif now - p.stat().st_mtime < settle_s:
                out.append(Candidate(p, "lightning", _step(p.stem), False, "modified moments ago"))
            else:
                step = _step(p.stem) if p.stem != "last" else 10**12 + int(p.stat().st_mtime)
                out.append(Candidate(p, "lightning", step, True, "valid zip archive"))
    return out


def find_latest_complete(
    root: str | Path, settle_s: float = 0.0, now: float | None = None
) -> Choice | None:
    """The newest complete checkpoint under root, or None on a fresh start."""
    root = Path(root)
    cands = candidates(root, settle_s, now)
    complete = [c for c in cands if c.complete]
    rejected = [c for c in cands if not c.complete]
    if not complete:
        return None
    best = max(complete, key=lambda c: (c.step, c.path.name))
    newer_bad = [c for c in rejected if c.step > best.step]
    why = f"{best.format} checkpoint at step {best.step}: {best.why}"
    if newer_bad:
        why += "; newer but incomplete: " + "; ".join(
            f"{c.path.name} ({c.why})" for c in sorted(newer_bad, key=lambda c: -c.step)
        )
    return Choice(best.path, best.format, best.step, why, rejected)


def describe(choice: Choice | None) -> str:
    return "fresh start: no complete checkpoint" if choice is None else json.dumps(choice.to_dict())
