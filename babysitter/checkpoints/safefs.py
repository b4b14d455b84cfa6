"""Reading (and writing into) a directory tree that a job's owner controls, without being
steered by it. Stdlib only.

- Every open is relative to an already-open directory and uses O_NOFOLLOW: the kernel never
  follows a link for us; discovery decides which links it follows (one hop, inside the root).
- O_NONBLOCK on every open, and only regular files are read: a FIFO or device where a file
  should be never blocks and is never read.
- Reads are capped (pointer files 4 KiB, heartbeats 64 KiB): a 1 MB tracker is refused, not
  read.
- Walks stop at a budget of entries, depth and time and say "gave up: N entries".
- Numbers from these files are ASCII digits only, with a bounded length.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

POINTER_CAP = 4096
HEARTBEAT_CAP = 64 * 1024
JSON_INDEX_CAP = 4 * 1024 * 1024  # model.safetensors.index.json of a very large model
MAX_DIGITS = 12
MAX_ENTRIES = 100_000
# names one directory listing may hold before discovery calls it unknown: a name costs one
# directory-entry read, not a stat, and is never charged to the entry budget
MAX_NAMES = 10_000_000
MAX_DEPTH = 8
WALK_SECONDS = 10.0

_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIGITS = re.compile(r"[0-9]+", re.ASCII)


class Refused(Exception):
    """A path or file that is not used, and why (the message is shown to people)."""


class GaveUp(Exception):
    def __init__(self, entries: int, why: str, out_of_time: bool = False) -> None:
        super().__init__(f"gave up: {entries} entries ({why})")
        self.entries = entries
        self.out_of_time = out_of_time  # the whole walk's time is spent, not one subtree's entries


@dataclass
class Budget:
    max_entries: int = MAX_ENTRIES
    max_depth: int = MAX_DEPTH
    seconds: float = WALK_SECONDS
    seen: int = 0
    started: float = 0.0

    def __post_init__(self) -> None:
        self.started = time.monotonic()

    def tick(self, n: int = 1) -> None:
        self.seen += n
        if self.seen > self.max_entries:
            raise GaveUp(self.seen, f"more than {self.max_entries}")
        if time.monotonic() - self.started > self.seconds:
            raise GaveUp(self.seen, f"walk took more than {self.seconds:g} s", out_of_time=True)

    def check_clock(self, entries: int) -> None:
        if time.monotonic() - self.started > self.seconds:
            raise GaveUp(entries, f"walk took more than {self.seconds:g} s", out_of_time=True)

    def part(self) -> Budget:
        """A budget of its own entries for one subtree (a checkpoint candidate) that shares
        this walk's clock: one huge candidate gives up alone, the time bound stays global."""
        b = Budget(self.max_entries, self.max_depth, self.seconds)
        b.started = self.started
        return b


def ascii_int(text: str, max_digits: int = MAX_DIGITS) -> int | None:
    """An int from ASCII digits only (`str.isdigit` accepts '²' and 5,000 digits; this does
    not)."""
    if 0 < len(text) <= max_digits and _DIGITS.fullmatch(text):
        return int(text)
    return None


def last_number(name: str, max_digits: int = MAX_DIGITS) -> int:
    """The last run of ASCII digits in a name (the step), -1 if none or too long."""
    nums = _DIGITS.findall(name)
    if not nums:
        return -1
    n = ascii_int(nums[-1], max_digits)
    return -1 if n is None else n


def check_name(name: str) -> str:
    """A single plain name inside a directory: no '/', not '.' or '..', no NUL."""
    if not name or name in (".", "..") or "/" in name or "\0" in name or len(name) > 255:
        raise Refused(f"{name!r} is not a plain name inside the directory")
    return name


def why(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symbolic link (not followed)"
    if exc.errno == errno.ENOENT:
        return "vanished or missing"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied (the job's owner cannot read it)"
    if exc.errno == errno.ENOTDIR:
        return "not a directory"
    return os.strerror(exc.errno or 0) or type(exc).__name__


def open_root(path: str | Path) -> int:
    """The checkpoint directory itself. Links in the path the user gave are followed (it is
    their path, and this runs with their rights); nothing inside it is."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)


def open_dir(dirfd: int, name: str) -> int:
    try:
        return os.open(check_name(name), _O_DIR, dir_fd=dirfd)
    except NotADirectoryError:
        # O_DIRECTORY|O_NOFOLLOW on a link says ENOTDIR: name it as the link it is
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name) from None
        raise


def open_rel(rootfd: int, rel: tuple[str, ...]) -> int:
    """A directory below the root, each component opened without following links."""
    fd = os.dup(rootfd)
    try:
        for part in rel:
            nfd = open_dir(fd, part)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file(dirfd: int, name: str) -> tuple[int, os.stat_result]:
    """A regular file, never through a link, never blocking."""
    fd = os.open(check_name(name), _O_FILE, dir_fd=dirfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{name} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_capped(dirfd: int, name: str, cap: int) -> bytes:
    fd, st = open_file(dirfd, name)
    try:
        if st.st_size > cap:
            raise Refused(f"{name} is {st.st_size} bytes, over the {cap}-byte cap")
        data = b""
        while len(data) <= cap:
            chunk = os.read(fd, cap + 1 - len(data))
            if not chunk:
                break
            data += chunk
        if len(data) > cap:
            raise Refused(f"{name} grew past the {cap}-byte cap")
        return data
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Entry:
    name: str
    st: os.stat_result

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.st.st_mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.st.st_mode)

    @property
    def is_link(self) -> bool:
        return stat.S_ISLNK(self.st.st_mode)


def scan(dirfd: int, budget: Budget, skipped: list[str] | None = None) -> list[Entry]:
    """The entries of a directory (lstat, nothing followed); entries that vanish between the
    listing and the stat are skipped with a reason."""
    out: list[Entry] = []
    with os.scandir(dirfd) as it:
        for de in it:
            budget.tick()
            try:
                out.append(Entry(de.name, de.stat(follow_symlinks=False)))
            except FileNotFoundError:
                if skipped is not None:
                    skipped.append(f"{de.name}: vanished during the scan")
    return sorted(out, key=lambda e: e.name)


def names(dirfd: int, budget: Budget, cap: int = MAX_NAMES) -> list[tuple[str, str]]:
    """Every (name, kind) of a directory, kind "dir" "file" "link" or "other" as the directory
    entry tells it (no stat where the file system reports the type). Bounded by `cap` names and
    the walk's clock, never by the entry budget: stray files beside the checkpoints must not
    spend what the checkpoints need."""
    out: list[tuple[str, str]] = []
    with os.scandir(dirfd) as it:
        for de in it:
            if len(out) >= cap:
                raise GaveUp(len(out), f"more than {cap} names in one directory")
            if len(out) % 4096 == 0:
                budget.check_clock(len(out))
            try:
                if de.is_symlink():
                    kind = "link"
                elif de.is_dir(follow_symlinks=False):
                    kind = "dir"
                elif de.is_file(follow_symlinks=False):
                    kind = "file"
                else:
                    kind = "other"
            except OSError:  # vanished between the listing and a type lookup
                continue
            out.append((de.name, kind))
    return out


def walk(
    dirfd: int,
    budget: Budget,
    visit: Callable[[int, str, Entry], None],
    prefix: str = "",
    depth: int = 0,
) -> None:
    """Call visit(parent dirfd, relative name, entry) for every non-directory entry below
    dirfd; links are visited (as links), never entered; directories are opened without
    following."""
    if depth > budget.max_depth:
        raise GaveUp(budget.seen, f"deeper than {budget.max_depth} levels")
    for e in scan(dirfd, budget):
        rel = f"{prefix}{e.name}"
        if e.is_dir:
            sub = open_dir(dirfd, e.name)
            try:
                walk(sub, budget, visit, rel + "/", depth + 1)
            finally:
                os.close(sub)
        else:
            visit(dirfd, rel, e)


def newest_mtime(dirfd: int, budget: Budget, depth: int = 0) -> float | None:
    """The newest modification time of anything below dirfd (lstat only); unreadable
    directories are skipped."""
    newest: float | None = None
    if depth > budget.max_depth:
        return None
    for e in scan(dirfd, budget):
        if e.name.startswith(".babysitter"):
            continue
        newest = e.st.st_mtime if newest is None else max(newest, e.st.st_mtime)
        if e.is_dir:
            try:
                sub = open_dir(dirfd, e.name)
            except OSError:
                continue
            try:
                n = newest_mtime(sub, budget, depth + 1)
            finally:
                os.close(sub)
            if n is not None:
                newest = n if newest is None else max(newest, n)
    return newest


def resolve_link(rootfd: int, root: Path, dirrel: tuple[str, ...], name: str) -> tuple[str, ...]:
    """Where a link inside the root points, as a path relative to the root; refused when it
    leaves the root. One hop: the caller opens the result without following further links."""
    d = open_rel(rootfd, dirrel)
    try:
        target = os.readlink(check_name(name), dir_fd=d)
    finally:
        os.close(d)
    if target.startswith("/"):
        for base in {str(root), os.path.realpath(root)}:
            if target == base or target.startswith(base.rstrip("/") + "/"):
                rel = target[len(base.rstrip("/")) :]
                break
        else:
            raise Refused(f"{name} -> {target} leaves the checkpoint directory: not followed")
    else:
        rel = "/".join((*dirrel, target))
    parts: list[str] = []
    for p in rel.split("/"):
        if p in ("", "."):
            continue
        if p == "..":
            if not parts:
                raise Refused(f"{name} -> {target} leaves the checkpoint directory: not followed")
            parts.pop()
        else:
            parts.append(p)
    if not parts:
        raise Refused(f"{name} -> {target} names the checkpoint directory itself")
    return tuple(parts)


def lstat_rel(rootfd: int, rel: tuple[str, ...]) -> os.stat_result:
    d = open_rel(rootfd, rel[:-1])
    try:
        return os.stat(check_name(rel[-1]), dir_fd=d, follow_symlinks=False)
    finally:
        os.close(d)
