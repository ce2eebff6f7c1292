"""Small durable state files: ``currterm`` (term + vote) and ``checkpoint``.

Both are Java-properties style text (``key=value`` lines, as DLedger writes them) and are
replaced atomically: write a temp file, fsync it, rename it over the old one, fsync the
directory. A reader therefore sees the old or the new content, never a mix.

Invariants:
- ``currterm`` is durable before any vote or append reply that depends on it is sent
  (the Raft layer calls :meth:`TermVoteFile.save` and only then replies);
- ``checkpoint`` never claims more than is durable in the data files: the store writes a
  committed index only after the data up to that entry has been synced.

What the store writes into them, and in which order, is :mod:`dledger.store.state_files`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


class MetaFileError(ValueError):
    """A state file exists but cannot be parsed."""


def write_atomic(path: Path, content: str | bytes) -> None:
    """Replace ``path`` atomically and durably: temp file, fsync, rename, directory fsync.
    On failure (a full disk, say) ``path`` is as it was and no temp file is left."""
    tmp = path.with_name(path.name + ".tmp")
    data = content.encode() if isinstance(content, str) else content
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(directory: Path, *, missing_ok: bool = False) -> None:
    """fsync a directory, so that names created, renamed or deleted in it are durable.
    The one copy for every package (the consume queues and the broker use it too).
    ``missing_ok``: a directory deleted meanwhile is skipped (its parent's fsync is what
    makes that deletion durable)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except FileNotFoundError:
        if missing_ok:
            return
        raise
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_properties(path: Path) -> dict[str, str] | None:
    """Parse a properties file; ``None`` when it does not exist."""
    try:
        raw_bytes = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        text = raw_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MetaFileError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    props: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise MetaFileError(f"{path}:{n}: expected key=value, got {line!r}")
        props[key.strip()] = value.strip()
    return props


MAX_VALUE = (1 << 62) - 1
"""The largest term, index or position a state file may hold: the wire's ``MAX_TERM`` and
``MAX_INDEX``, so nothing read from disk is beyond what the group can send."""


def _int(
    props: dict[str, str], key: str, path: Path, default: int, *, lo: int = -1, hi: int = MAX_VALUE
) -> int:
    raw = props.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise MetaFileError(f"{path}: {key}={raw!r} is not an integer") from None
    if not lo <= value <= hi:
        raise MetaFileError(f"{path}: {key}={value} is outside [{lo}, {hi}]")
    return value


@dataclass(frozen=True, slots=True)
class TermVote:
    term: int = 0
    voted_for: str | None = None


class TermVoteFile:
    """The ``currterm`` file: ``currTerm`` and ``voteLeader`` (DLedger's key names)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> TermVote:
        props = read_properties(self.path)
        if props is None:
            return TermVote()
        term = _int(props, "currTerm", self.path, 0, lo=0)
        vote = props.get("voteLeader") or None
        return TermVote(term, vote)

    def save(self, tv: TermVote) -> None:
        write_atomic(self.path, f"currTerm={tv.term}\nvoteLeader={tv.voted_for or ''}\n")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What the store persists besides the segments.

    ``begin_index``/``begin_pos``: the first entry the log holds or will hold (after a
    reset or head deletion); ``before_begin_term``: the term of entry ``begin_index - 1``
    (-1 when there is none) and ``before_begin_chain`` its chain CRC;
    ``committed_index``/``committed_pos``: the last entry known committed and durable, and
    the position just past it. ``pending_reset``: the log was reset to begin here and the
    segments from before may still be on disk (a crash in the middle of ``reset``):
    recovery deletes every segment it finds, and only then is the log known empty.
    """

    begin_index: int = 0
    begin_pos: int = 0
    before_begin_term: int = -1
    before_begin_chain: int = 0
    committed_index: int = -1
    committed_pos: int = 0
    end_index: int = -1
    pending_reset: bool = False


class CheckpointFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> Checkpoint | None:
        props = read_properties(self.path)
        if props is None:
            return None
        p = self.path
        cp = Checkpoint(
            begin_index=_int(props, "beginIndex", p, 0, lo=0),
            begin_pos=_int(props, "beginPos", p, 0, lo=0),
            before_begin_term=_int(props, "beforeBeginTerm", p, -1),
            before_begin_chain=_int(props, "beforeBeginChain", p, 0, lo=0, hi=0xFFFFFFFF),
            committed_index=_int(props, "committedIndex", p, -1),
            committed_pos=_int(props, "committedPos", p, 0, lo=0),
            end_index=_int(props, "endIndex", p, -1),
            pending_reset=bool(_int(props, "pendingReset", p, 0, lo=0, hi=1)),
        )
        if cp.committed_index < cp.begin_index - 1:
            raise MetaFileError(f"{p}: inconsistent checkpoint {cp}")
        return cp

    def save(self, cp: Checkpoint) -> None:
        write_atomic(
            self.path,
            f"beginIndex={cp.begin_index}\nbeginPos={cp.begin_pos}\n"
            f"beforeBeginTerm={cp.before_begin_term}\nbeforeBeginChain={cp.before_begin_chain}\n"
            f"committedIndex={cp.committed_index}\n"
            f"committedPos={cp.committed_pos}\nendIndex={cp.end_index}\n"
            + ("pendingReset=1\n" if cp.pending_reset else ""),
        )
