"""Checkpoint discovery: the newest COMPLETE checkpoint under a directory, and why.

Formats, and what makes one complete (shared notes: domain.md):
- DeepSpeed: `latest` names a tag directory. The framework writes `latest` last, so the pointer
  IS the completion marker (no "modified moments ago" rejection); the tag directory must hold
  `*model_states.pt` files (a stray file is not a checkpoint). Older `global_stepN` directories
  were each named by `latest` once: when the pointed-to one is incomplete, the newest older
  complete one is used. Newer ones are still being written.
- Megatron-LM: `latest_checkpointed_iteration.txt` (ASCII digits or `release`) names `iter_NNNNNNN/`
  (model `.pt` files or a distributed checkpoint); same pointer and fallback rules.
- PyTorch DCP: a directory holding `.metadata` (the coordinator writes it last).
- Hugging Face Trainer: `checkpoint-<step>/` with `trainer_state.json`; each `.safetensors`
  file's header must account for the file size exactly, index shards must exist.
- Lightning / NeMo: `*.ckpt` files (torch zip archives: a truncated one has no central
  directory). `last.ckpt` as a link inside the directory is followed once.
- Generic: `<name>/` with a `.complete` marker (what `babysitter.job.mark_checkpoint_complete`
  writes, last).

Everywhere: `.pt/.pth/.ckpt` files must be valid zip archives whose members fit in the file (the
central directory is read, not every byte: a 40 GB shard is checked in milliseconds), no
zero-size shard, no temporary names. Links are followed only inside the directory, one hop;
dangling links and files that vanish mid-scan are skipped with a reason. All access goes through
safefs (no link followed by the kernel, no blocking open, regular files only, capped reads).

Bounded so that the bound cannot hide a checkpoint: the directory is listed by name first (a
name costs a directory-entry read, not a stat; stray files beside the checkpoints cost no
budget), names are ranked by their step, and entries are examined newest first within the
entry budget (depth and time too), contents newest first, each candidate within its own entry
budget. What the budget did not reach is older than what it did. When it runs out before the
newest checkpoint is known (a candidate too big to verify, the clock): the answer says
"unknown" (`Scan.unknown`, `Choice.warning`), never a silent fresh start; the resume then uses
the newest VERIFIED complete checkpoint and records the warning (docs/jobs.md).
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from babysitter.checkpoints.safefs import (
    JSON_INDEX_CAP,
    POINTER_CAP,
    Budget,
    Entry,
    GaveUp,
    Refused,
    ascii_int,
    check_name,
    last_number,
    lstat_rel,
    names,
    open_file,
    open_rel,
    open_root,
    read_capped,
    resolve_link,
    walk,
    why,
)

MARKER = ".complete"
HF_INDEX = "model.safetensors.index.json"
DS_POINTER = "latest"
MG_POINTER = "latest_checkpointed_iteration.txt"
_TMP_RE = re.compile(r"(\.tmp|\.partial|\.incomplete|~)$|^(tmp|\.tmp)", re.I)
_ITER_RE = re.compile(r"iter_[0-9]+$", re.ASCII)
_ZIP_SUFFIXES = (".pt", ".pth", ".ckpt")
_SAFETENSORS_HEADER_CAP = 100 * 1024 * 1024  # the format's own limit
MAX_NOTES = 20


@dataclass
class Candidate:
    path: Path
    format: str
    step: int
    complete: bool
    why: str
    # the content check still to run (discovery runs them newest first, see check_newest_first)
    check: Callable[[], tuple[bool, str]] | None = field(default=None, repr=False, compare=False)
    unknown: bool = False  # its completeness could not be told (the budget ran out on it)


@dataclass
class Choice:
    path: Path
    format: str
    step: int
    explanation: str
    rejected: list[Candidate] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    # not empty: a newer checkpoint may exist that the budget could not verify
    warning: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "format": self.format,
            "step": self.step,
            "explanation": self.explanation,
            "warning": self.warning,
            "rejected": [{"path": str(c.path), "why": c.why} for c in self.rejected],
            "skipped": list(self.skipped),
        }


@dataclass
class Scan:
    """Everything one discovery saw: candidates, entries skipped (with reasons), and whether
    the walk gave up."""

    root: Path
    candidates: list[Candidate] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    gave_up: str = ""
    # (name, step) of entries the budget did not reach: ranked below every examined one
    unexamined: list[tuple[str, int]] = field(default_factory=list)

    def unverified_above(self, step: int) -> list[str]:
        """What may be a complete checkpoint newer than `step`, but the budget could not tell."""
        out = [
            f"{c.path.name} ({c.why})"
            for c in sorted(self.candidates, key=lambda c: -c.step)
            if c.unknown and c.step > step
        ]
        above = [n for n, s in self.unexamined if s > step]
        if above:
            out.append(f"{len(above)} entries not examined (the newest: {above[0]})")
        return out

    @property
    def unknown(self) -> bool:
        """The newest complete checkpoint cannot be told: never read as "none"."""
        best = max((c.step for c in self.candidates if c.complete), default=-2)
        return bool(self.unverified_above(best)) or (best == -2 and bool(self.gave_up))

    def choice(self) -> Choice | None:
        complete = [c for c in self.candidates if c.complete]
        rejected = [c for c in self.candidates if not c.complete]
        if not complete:
            return None
        best = max(complete, key=lambda c: (c.step, c.path.name))
        newer_bad = [c for c in rejected if c.step > best.step and not c.unknown]
        unverified = self.unverified_above(best.step)
        warning = ""
        if unverified:
            warning = (
                "newer checkpoint(s) could not be verified within the discovery budget: "
                + "; ".join(unverified[:5])
                + f"; resuming from the newest verified one (step {best.step})"
            )
        text = f"{best.format} checkpoint at step {best.step}: {best.why}"
        if newer_bad:
            text += "; newer but incomplete: " + "; ".join(
                f"{c.path.name} ({c.why})" for c in sorted(newer_bad, key=lambda c: -c.step)[:5]
            )
        if warning:
            text = f"WARNING: {warning}; {text}"
        text += self._notes()
        return Choice(
            best.path, best.format, best.step, text, rejected, self.skipped[:MAX_NOTES], warning
        )

    def explain_none(self) -> str:
        if self.unknown:
            unverified = self.unverified_above(-2)
            text = (
                "UNKNOWN: the discovery budget ran out before a complete checkpoint was found "
                "(not a fresh start by choice)"
            )
            if unverified:
                text += ": " + "; ".join(unverified[:5])
            return text + self._notes()
        text = "no complete checkpoint"
        if self.candidates:
            text += ": " + "; ".join(
                f"{c.path.name} ({c.why})"
                for c in sorted(self.candidates, key=lambda c: -c.step)[:5]
            )
        return text + self._notes()

    def _notes(self) -> str:
        notes = [*self.skipped[:MAX_NOTES]]
        if len(self.skipped) > MAX_NOTES:
            notes.append(f"{len(self.skipped) - MAX_NOTES} more skipped")
        if self.gave_up:
            notes.append(self.gave_up)
        return ("; skipped: " + "; ".join(notes)) if notes else ""


class _Bad(Exception):
    pass


class _TooBig(Exception):
    """A candidate's contents exceed its entry budget: its completeness is unknown."""


def _zip_problem(dirfd: int, name: str) -> str | None:
    fd, st = open_file(dirfd, name)
    with os.fdopen(fd, "rb") as f:
        try:
            with zipfile.ZipFile(f) as z:
                infos = z.infolist()
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError, OSError):
            return f"truncated or invalid archive {name}"
    if not infos:
        return f"empty archive {name}"
    end = max(i.header_offset + i.compress_size for i in infos)
    if end > st.st_size:
        return f"truncated archive {name}"
    return None


def _safetensors_problem(dirfd: int, name: str) -> str | None:
    fd, st = open_file(dirfd, name)
    with os.fdopen(fd, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"truncated safetensors {name} (no header)"
        n = int.from_bytes(head, "little")
        if n > _SAFETENSORS_HEADER_CAP or 8 + n > st.st_size:
            return f"truncated safetensors {name} (header of {n} bytes, file {st.st_size})"
        try:
            hdr = json.loads(f.read(n))
        except ValueError:
            return f"invalid safetensors header in {name}"
    if not isinstance(hdr, dict):
        return f"invalid safetensors header in {name}"
    end = 0
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        offs = v.get("data_offsets") if isinstance(v, dict) else None
        if (
            not isinstance(offs, list)
            or len(offs) != 2
            or not all(type(x) is int and x >= 0 for x in offs)
        ):
            return f"invalid safetensors header in {name}"
        end = max(end, offs[1])
    if 8 + n + end != st.st_size:
        return f"truncated safetensors {name} (tensors end at {8 + n + end}, file {st.st_size})"
    return None


def _index_problem(raw: bytes, files: list[str]) -> str | None:
    """Why a sharded-weights index does not prove its checkpoint complete, or None. An index
    that is not the expected {"weight_map": {tensor: shard file}} object is unreadable, and
    unreadable means incomplete, never "no shards to check"."""
    try:
        idx = json.loads(raw)
    except ValueError:
        return f"{HF_INDEX} is not valid JSON"
    wm = idx.get("weight_map") if isinstance(idx, dict) else None
    if not isinstance(wm, dict) or not wm or not all(isinstance(v, str) for v in wm.values()):
        return f"{HF_INDEX} is not a JSON object with a weight_map of shard file names"
    missing = sorted(set(wm.values()) - set(files))
    if missing:
        return f"index names missing shard {missing[0]}"
    return None


class _Scanner:
    def __init__(self, root: Path, rootfd: int, budget: Budget, settle_s: float, now: float):
        self.root, self.rootfd, self.budget = root, rootfd, budget
        self.settle_s, self.now = settle_s, now
        self.out = Scan(root)

    def path(self, rel: tuple[str, ...]) -> Path:
        return self.root.joinpath(*rel)

    def skip(self, what: str) -> None:
        self.out.skipped.append(what)

    # ---- content of one candidate directory
    def content(self, rel: tuple[str, ...], fmt: str) -> tuple[bool, str]:
        try:
            dfd = open_rel(self.rootfd, rel)
        except OSError as exc:
            return False, f"cannot open: {why(exc)}"
        files: list[str] = []

        def visit(pfd: int, name: str, e: Entry) -> None:
            base = name.rsplit("/", 1)[-1]
            if e.is_link:
                return  # links inside a checkpoint are not followed (nor needed)
            if not e.is_file:
                raise _Bad(f"{name} is not a regular file")
            files.append(name)
            if e.st.st_size == 0 and base != MARKER:
                raise _Bad(f"zero-size shard {name}")
            problem = None
            if base.endswith(_ZIP_SUFFIXES) or (
                fmt == "hf_trainer" and base.startswith("pytorch_model") and base.endswith(".bin")
            ):
                problem = _zip_problem(pfd, base)
            elif base.endswith(".safetensors"):
                problem = _safetensors_problem(pfd, base)
            if problem:
                raise _Bad(problem)

        try:
            walk(dfd, self.budget.part(), visit)
            if fmt == "hf_trainer" and HF_INDEX in files:
                problem = _index_problem(read_capped(dfd, HF_INDEX, JSON_INDEX_CAP), files)
                if problem:
                    return False, problem
        except GaveUp as g:
            if g.out_of_time:
                raise  # the whole discovery is out of time: the rest stays "not checked"
            # this candidate alone is too big to check: unknown (neither complete nor not);
            # the next older one still can be verified, and the answer says what was not
            raise _TooBig(str(g)) from None
        except _Bad as bad:
            return False, str(bad)
        except FileNotFoundError:
            return False, "a file vanished during the scan"
        except (Refused, ValueError) as exc:
            return False, str(exc)
        except OSError as exc:
            return False, f"cannot read: {why(exc)}"
        finally:
            os.close(dfd)
        if not files:
            return False, "empty directory"
        if fmt == "deepspeed" and not any(f.endswith("model_states.pt") for f in files):
            return False, "no *model_states.pt: not a DeepSpeed checkpoint"
        if fmt == "megatron" and not any(
            f.endswith(".pt") or f in (".metadata", "metadata.json") for f in files
        ):
            return False, "no model files"
        return True, "all shards present"

    def has(self, rel: tuple[str, ...], name: str) -> bool:
        try:
            st = lstat_rel(self.rootfd, (*rel, name))
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode)

    # ---- framework pointers
    def pointer(self, names: dict[str, Entry], fname: str, fmt: str) -> tuple[str, int] | None:
        """(pointed-to name, its step) from a pointer file, and a candidate for it."""
        e = names.get(fname)
        if e is None or e.is_link or e.is_dir:
            return None  # a link named `latest` is an ordinary link, handled with the others
        try:
            raw = read_capped(self.rootfd, fname, POINTER_CAP)
        except (Refused, OSError) as exc:
            msg = str(exc) if isinstance(exc, Refused) else why(exc)
            self.skip(f"{fname}: {msg}" if isinstance(exc, OSError) else msg)
            return None
        text = os.fsdecode(raw.strip())
        if fmt == "megatron":
            n = ascii_int(text)
            if text == "release":
                name, step = "release", -1
            elif n is None:
                self.skip(f"{fname} holds {text[:40]!r}: not a number of at most 12 ASCII digits")
                return None
            else:
                name, step = f"iter_{n:07d}", n
        else:
            name, step = text, last_number(text)
        try:
            check_name(name)
        except Refused:
            self.skip(f"`{fname}` names {name[:80]!r}: refused (not a name inside the directory)")
            return None
        p = self.path((name,))
        try:
            st = lstat_rel(self.rootfd, (name,))
        except OSError:
            self.out.candidates.append(
                Candidate(p, fmt, step, False, f"`{fname}` names {name!r}, which does not exist")
            )
            return name, step
        if not stat.S_ISDIR(st.st_mode):
            self.out.candidates.append(
                Candidate(p, fmt, step, False, f"`{fname}` names {name!r}: not a directory")
            )
            return name, step

        def check() -> tuple[bool, str]:
            ok, detail = self.content((name,), fmt)
            return (
                ok,
                f"named by `{fname}` (written last by the framework); {detail}" if ok else detail,
            )

        self.out.candidates.append(Candidate(p, fmt, step, False, "", check))
        return name, step

    def older(
        self, rel: tuple[str, ...], fmt: str, step: int, ptr: tuple[str, int] | None, fname: str
    ) -> Candidate:
        p = self.path(rel)
        if ptr is None:
            return Candidate(p, fmt, step, False, f"no `{fname}` names it")
        if ptr[1] < 0 or step >= ptr[1]:
            return Candidate(p, fmt, step, False, f"newer than `{fname}` ({ptr[0]}): not finished")

        def check() -> tuple[bool, str]:
            ok, detail = self.content(rel, fmt)
            return ok, f"older than `{fname}` ({ptr[0]}); {detail}"

        return Candidate(p, fmt, step, False, "", check)

    # ---- one top-level entry
    def classify(
        self,
        rel: tuple[str, ...],
        e: Entry,
        ds: tuple[str, int] | None,
        mg: tuple[str, int] | None,
    ) -> Candidate | None:
        name = rel[-1]
        p = self.path(rel)
        step = last_number(name)
        if e.is_file:
            if not name.endswith(".ckpt"):
                return None
            if _TMP_RE.search(name):
                return Candidate(p, "lightning", step, False, "temporary name")
            if e.st.st_size == 0:
                return Candidate(p, "lightning", step, False, "zero-size archive")
            try:
                d = open_rel(self.rootfd, rel[:-1])
                try:
                    problem = _zip_problem(d, name)
                finally:
                    os.close(d)
            except (Refused, OSError) as exc:
                problem = str(exc) if isinstance(exc, Refused) else why(exc)
            if problem:
                return Candidate(p, "lightning", step, False, problem)
            if self.now - e.st.st_mtime < self.settle_s:
                return Candidate(p, "lightning", step, False, "modified moments ago")
            if name == "last.ckpt":
                step = 10**12 + int(e.st.st_mtime)
            return Candidate(p, "lightning", step, True, "valid zip archive")
        if not e.is_dir:
            return None
        if _TMP_RE.search(name):
            return Candidate(p, "generic", step, False, "temporary name: still being written")
        if (ds is not None and name == ds[0]) or (mg is not None and name == mg[0]):
            return None  # the pointer's own candidate
        if name.startswith("global_step"):
            return self.older(rel, "deepspeed", step, ds, DS_POINTER)
        if _ITER_RE.match(name):
            return self.older(rel, "megatron", step, mg, MG_POINTER)
        try:
            dfd = open_rel(self.rootfd, rel)
            os.close(dfd)
        except OSError as exc:
            if _TMP_RE.search(name) or step < 0:
                return None
            return Candidate(p, "generic", step, False, f"cannot open: {why(exc)}")
        if self.has(rel, ".metadata") or (
            name.startswith("step")
            and not any(self.has(rel, n) for n in ("trainer_state.json", MARKER))
        ):
            return self.with_marker(rel, "torch_dcp", step, ".metadata")
        if name.startswith("checkpoint-"):
            return self.with_marker(rel, "hf_trainer", step, "trainer_state.json")
        if self.has(rel, MARKER):
            return self.with_marker(rel, "generic", step, MARKER)
        if step >= 0:
            return Candidate(p, "generic", step, False, f"no completion marker ({MARKER})")
        return None

    def with_marker(self, rel: tuple[str, ...], fmt: str, step: int, need: str) -> Candidate:
        p = self.path(rel)
        if not self.has(rel, need):
            return Candidate(p, fmt, step, False, f"no {need}: not finished")

        def check() -> tuple[bool, str]:
            ok, detail = self.content(rel, fmt)
            return ok, f"{need} present; {detail}" if ok else detail

        return Candidate(p, fmt, step, False, "", check)

    def entries(self) -> tuple[dict[str, str], list[tuple[str, int]]]:
        """The directory by name (name -> kind), and the names that may be a checkpoint ranked
        newest first (by the step in the name; links and unnumbered names, `last.ckpt`, first:
        their step is known only once they are looked at). Stray files cost no budget."""
        listed = dict(names(self.rootfd, self.budget))
        ranked = [
            (n, last_number(n))
            for n, kind in listed.items()
            if not n.startswith(".babysitter")
            and (kind in ("dir", "link") or (kind == "file" and n.endswith(".ckpt")))
        ]
        ranked.sort(key=lambda x: (listed[x[0]] == "link" or x[1] < 0, x[1], x[0]), reverse=True)
        return listed, ranked

    def lstat_top(self, name: str) -> Entry | None:
        try:
            return Entry(name, lstat_rel(self.rootfd, (name,)))
        except FileNotFoundError:
            self.skip(f"{name}: vanished during the scan")
            return None

    def run(self) -> Scan:
        try:
            listed, ranked = self.entries()
            pointers = {
                n: e for n in (DS_POINTER, MG_POINTER) if n in listed and (e := self.lstat_top(n))
            }
            ds = self.pointer(pointers, DS_POINTER, "deepspeed")
            mg = self.pointer(pointers, MG_POINTER, "megatron")
            done: set[tuple[str, ...]] = set()
            for i, (name, _step) in enumerate(ranked):
                try:
                    self.budget.tick()
                except GaveUp as g:
                    if g.out_of_time:
                        raise
                    # every name below this one is older: what was examined can still win
                    self.out.gave_up = str(g)
                    self.out.unexamined = ranked[i:]
                    break
                found = self.lstat_top(name)
                if found is None:
                    continue
                e = found
                if e.name in (DS_POINTER, MG_POINTER) and not e.is_link:
                    continue  # pointer files were read above
                rel: tuple[str, ...] = (e.name,)
                if e.is_link:
                    try:
                        rel = resolve_link(self.rootfd, self.root, (), e.name)
                        st = lstat_rel(self.rootfd, rel)
                    except Refused as r:
                        self.skip(str(r))
                        continue
                    except FileNotFoundError:
                        self.skip(f"{e.name}: dangling link")
                        continue
                    except OSError as exc:
                        self.skip(f"{e.name}: link target {why(exc)}")
                        continue
                    if stat.S_ISLNK(st.st_mode):
                        self.skip(f"{e.name}: link to a link: not followed")
                        continue
                    if len(rel) == 1 and rel[0] in listed:
                        continue  # the target is a candidate of its own
                    e = Entry(rel[-1], st)
                if rel in done:
                    continue
                done.add(rel)
                c = self.classify(rel, e, ds, mg)
                if c is not None:
                    self.out.candidates.append(c)
            self.check_newest_first()
        except GaveUp as g:
            self.out.gave_up = str(g)
            for c in self.out.candidates:
                if c.check is not None:
                    c.check, c.why, c.unknown = None, f"not checked: {g}", True
        return self.out

    def check_newest_first(self) -> None:
        """Read the contents of candidates newest first and stop at the first complete one:
        the cost (and the walk budget) goes to the checkpoints that can win, not to the fifty
        older ones a run keeps."""
        best = max((c.step for c in self.out.candidates if c.complete), default=None)
        for c in sorted(self.out.candidates, key=lambda c: (c.step, c.path.name), reverse=True):
            if c.check is None:
                continue
            if best is not None and c.step < best:
                c.check, c.why = None, "not checked: a newer checkpoint is complete"
                continue
            check, c.check = c.check, None
            try:
                c.complete, c.why = check()
            except _TooBig as big:
                c.complete, c.unknown, c.why = False, True, f"not verified: {big}"
                continue
            if c.complete and (best is None or c.step > best):
                best = c.step


def discover(
    root: str | Path,
    settle_s: float = 0.0,
    now: float | None = None,
    budget: Budget | None = None,
) -> Scan:
    """Everything discovery sees under root (empty when root does not exist). Raises OSError
    when root exists but cannot be opened."""
    root = Path(root)
    try:
        rootfd = open_root(root)
    except FileNotFoundError:
        return Scan(root)
    try:
        now = time.time() if now is None else now
        return _Scanner(root, rootfd, budget or Budget(), settle_s, now).run()
    finally:
        os.close(rootfd)


def candidates(
    root: str | Path, settle_s: float = 0.0, now: float | None = None
) -> list[Candidate]:
    return discover(root, settle_s, now).candidates


def find_latest_complete(
    root: str | Path, settle_s: float = 0.0, now: float | None = None
) -> Choice | None:
    """The newest complete checkpoint under root, or None on a fresh start."""
    return discover(root, settle_s, now).choice()


def describe(choice: Choice | None) -> str:
    return "fresh start: no complete checkpoint" if choice is None else json.dumps(choice.to_dict())
