"""The file store's rules for its state files, ``checkpoint`` and ``currterm``: what each
may claim, and the order of the writes around them that keeps a crash anywhere safe
(their bytes and the atomic replace are :mod:`dledger.store.meta`; docs/formats.md).

- ``checkpoint_claim``: the checkpoint never claims more committed than is durable (the
  store's ``durable_index``): recovery trusts the prefix below it without checking it.
- ``reset_files``: a reset (the log restarts after an installed snapshot) writes its
  intent first (``pendingReset``), then deletes the segments, makes that durable, and
  only then clears the intent. A crash in between leaves the new begin in force and a
  checkpoint that tells recovery every segment it still finds is old
  (``finish_reset`` then makes recovery's deletions durable the same way).
- ``load_term_vote``: a node with a past and no ``currterm`` lost it, and is refused: it
  could vote twice in a term.
- ``lock_directory``: one process at a time has a node directory (its ``lock`` file):
  two writing one log would corrupt it.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
from collections.abc import Callable
from pathlib import Path

from .base import StoreCorruptionError
from .entry import INDEX_UNIT_SIZE
from .meta import Checkpoint, CheckpointFile, TermVote, TermVoteFile
from .mmapfile import MmapFileList, StoreFileError
from .retention import LogHead


def checkpoint_claim(
    head: LogHead,
    *,
    committed_index: int,
    committed_pos: int,
    durable_index: int,
    entry_end: Callable[[int], int],
) -> Checkpoint:
    """The checkpoint the store may write now: committed as far as it is durable.
    ``head``: where the log begins (retention passes the begin it is about to make);
    ``entry_end(i)``: the pos just past entry ``i``."""
    committed = min(committed_index, durable_index)
    if committed < head.begin_index:
        committed_pos = head.begin_pos
    elif committed != committed_index:
        committed_pos = entry_end(committed)
    return Checkpoint(
        begin_index=head.begin_index,
        begin_pos=head.begin_pos,
        before_begin_term=head.before_begin_term,
        before_begin_chain=head.before_begin_chain,
        committed_index=max(committed, head.begin_index - 1),
        committed_pos=committed_pos,
        end_index=durable_index,
    )


def reset_files(
    data: MmapFileList, index: MmapFileList, checkpoint: CheckpointFile, head: LogHead
) -> None:
    """Drop every segment of both lists; the log then begins at ``head``, with everything
    before it committed (a snapshot covers it). Intent first: see the module docstring."""
    cp = Checkpoint(
        begin_index=head.begin_index,
        begin_pos=head.begin_pos,
        before_begin_term=head.before_begin_term,
        before_begin_chain=head.before_begin_chain,
        committed_index=head.begin_index - 1,
        committed_pos=head.begin_pos,
        end_index=head.begin_index - 1,
        pending_reset=True,
    )
    checkpoint.save(cp)
    data.reset(head.begin_pos)
    index.reset(head.begin_index * INDEX_UNIT_SIZE)
    finish_reset(data, index, checkpoint, cp)


def finish_reset(
    data: MmapFileList, index: MmapFileList, checkpoint: CheckpointFile, cp: Checkpoint
) -> None:
    """The segments of the reset ``cp`` are gone: make that durable, then say so. From
    then on a segment on disk is the new log's, and recovery keeps it."""
    data.fsync_dir()
    index.fsync_dir()
    checkpoint.save(dataclasses.replace(cp, pending_reset=False))


def load_term_vote(
    term_vote: TermVoteFile, *, has_past: bool, end_index: int, end_term: int
) -> TermVote:
    """The durable term and vote (``currterm``). A new node gets term 0 and no vote, and
    the file is made at once: from then on a missing one means a lost one.

    A node with a past (``has_past``: entries, a log that begins past 0, a checkpoint;
    its log ends at ``end_index`` of ``end_term``) and no ``currterm`` lost the file: it
    may have voted in any term up to the group's current one, and starting again at term
    0 with no vote it could vote a second time in one of them (two leaders in a term). No
    rule of Raft derives that vote back, so this refuses (``StoreCorruptionError``,
    saying how to recover)."""
    path = term_vote.path
    if path.exists():
        return term_vote.load()
    if has_past:
        raise StoreCorruptionError(
            f"{path} is missing, but this node has a past (its log holds entries up"
            f" to {end_index}, of term {end_term}): it may have voted,"
            " and starting at term 0 with no vote it could vote twice in a term."
            " Refusing to start. To recover, stop this node and read currTerm in the"
            " currterm file of every other node of the group (stopped ones too);"
            f" write 'currTerm=<the highest of them + 1>' and 'voteLeader=' into {path}"
            " (no candidate can have asked this node for a vote in a term no node has"
            " reached). Or wipe this node's data directory: it rejoins empty and"
            " catches up from the leader."
        )
    tv = TermVote()
    term_vote.save(tv)
    return tv


def lock_directory(directory: Path) -> int:
    """Hold an exclusive lock on ``<dir>/lock`` for the store's lifetime (the returned
    descriptor's): two processes writing one log would corrupt it."""
    fd = os.open(directory / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreFileError(f"{directory} is in use by another process") from None
    return fd
