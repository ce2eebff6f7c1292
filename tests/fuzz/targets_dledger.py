"""Fuzz targets of ``dledger``: what a peer sends (frames, the handshake, a leader's
entries) and what the disk holds (entries, ``currterm``, ``checkpoint``, whole logs)."""

from __future__ import annotations

import contextlib
import zlib
from pathlib import Path

from dledger.codes import DLedgerCode
from dledger.core.messages import (
    AppendRequest,
    AppendResponse,
    GetResponse,
    HeartBeatRequest,
    InstallSnapshotRequest,
    PushEntryRequest,
    PushEntryResponse,
    PushType,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from dledger.runtime import wire
from dledger.runtime.peer_auth import (
    NONCE_BYTES,
    ClientHandshake,
    PeerAuthError,
    ServerHandshake,
    client_mac,
    server_mac,
)
from dledger.store import FileStore, StoreCorruptionError, StoreError, StoreSettings
from dledger.store.entry import (
    BODY_OFFSET,
    UNKNOWN_CHAIN,
    CodecError,
    crc32,
    decode_entry,
    decode_header,
    decode_index_unit,
    encode_entry,
)
from dledger.store.meta import CheckpointFile, MetaFileError, TermVoteFile
from dledger.store.mmapfile import StoreFileError
from dledger.store.runs import encode_leader_runs, split_follower_runs

from .reader import Reader, Writer
from .registry import scratch_dir, target

FRAME_LIMIT = 1 << 16  # the decoder's max frame here: big frames teach nothing new

# ---- Raft frames ----------------------------------------------------------------------------


def _frame_seeds() -> list[bytes]:
    base = {"group": "g0", "local_id": "n1", "remote_id": "n0", "term": 3, "req_id": 7}
    entries = encode_entry(0, 3, 0, b"hello") + encode_entry(1, 3, 53, b"world")
    msgs: list[wire.WireMessage] = [
        VoteRequest(**base, leader_id="n1", ledger_end_index=5, ledger_end_term=2),
        VoteResponse(**base, vote_result=VoteResult.ACCEPT, pre_vote=True),
        HeartBeatRequest(**base, leader_id="n1"),
        PushEntryRequest(
            **base,
            leader_id="n1",
            type=PushType.APPEND,
            commit_index=0,
            first_index=0,
            count=2,
            entries=entries,
        ),
        PushEntryResponse(**base, code=DLedgerCode.SUCCESS, type=PushType.COMPARE, x_term=2),
        InstallSnapshotRequest(
            **base,
            leader_id="n1",
            last_included_index=9,
            last_included_term=2,
            before_begin_chain=12345,
            next_pos=4096,
            commit_index=9,
            total=2,
            data=b"{}",
        ),
        AppendRequest(**base, bodies=(b"a", b"bc")),
        AppendResponse(**base, code=DLedgerCode.SUCCESS, first_index=4, positions=(0, 49)),
        GetResponse(**base, code=DLedgerCode.SUCCESS, entries=entries),
    ]
    out = []
    for m in msgs:
        frame = wire.encode(m)
        out.append(Writer().uint(len(frame) // 2, 2).raw(frame[4:]).done())
    return out


@target("wire_frame", max_len=4096, seeds=_frame_seeds)
def wire_frame(data: bytes) -> None:
    """A frame body (``wire.decode``) and a byte stream in two pieces (``FrameDecoder``):
    a message or ``FrameError``; what decodes encodes back to itself."""
    r = Reader(data)
    split = r.uint(2)
    body = r.rest()
    try:
        msg = wire.decode(body)
    except wire.FrameError:
        pass
    else:
        assert wire.decode(wire.encode(msg)[4:]) == msg, msg
    stream = wire.FrameDecoder(max_frame_bytes=FRAME_LIMIT)
    try:
        stream.feed(body[:split])
        stream.feed(body[split:])
    except wire.FrameError:
        assert stream.failed


# ---- the peer handshake ------------------------------------------------------------------------

SECRET = b"fuzzing secret"
SERVER_NONCE = bytes(range(NONCE_BYTES))
CLIENT_NONCE = bytes(range(100, 100 + NONCE_BYTES))


def _handshake_seeds() -> list[bytes]:
    server = ServerHandshake(SECRET, "n0", SERVER_NONCE)
    client = ClientHandshake(SECRET, "n0", CLIENT_NONCE)
    proof = client.answer(server.hello())
    return [
        Writer().uint(0, 1).raw(proof).done(),
        Writer().uint(1, 1).raw(server.hello()).done(),
        Writer().uint(2, 1).raw(server_mac(SECRET, "n0", SERVER_NONCE, CLIENT_NONCE)).done(),
        Writer().uint(0, 1).raw(client_mac(SECRET, "n1", SERVER_NONCE, CLIENT_NONCE)).done(),
    ]


@target("peer_handshake", max_len=256, seeds=_handshake_seeds)
def peer_handshake(data: bytes) -> None:
    """What the other side of a Raft connection sends during the peer-secret handshake:
    accepted, or ``PeerAuthError``."""
    r = Reader(data)
    step = r.uint(1) % 3
    payload = r.rest()
    server = ServerHandshake(SECRET, "n0", SERVER_NONCE)
    client = ClientHandshake(SECRET, "n0", CLIENT_NONCE)
    try:
        if step == 0:
            server.check_client_proof(payload)
        elif step == 1:
            client.answer(payload)
        else:
            client.answer(server.hello())
            client.check_server_proof(payload)
    except PeerAuthError:
        pass


# ---- entries ----------------------------------------------------------------------------------


def _entry_seeds() -> list[bytes]:
    one = encode_entry(5, 2, 4096, b"x" * 20)
    return [
        Writer().uint(0, 1).flag(True).raw(one + encode_entry(6, 2, 4164, b"")).done(),
        Writer().uint(3, 1).flag(False).raw(bytes(3) + one).done(),
    ]


@target("entry_codec", max_len=1024, seeds=_entry_seeds)
def entry_codec(data: bytes) -> None:
    """An entry header, a whole entry (CRC checked or not) and an index unit at an
    offset: a value or ``CodecError``; a verified entry's body matches its CRC."""
    r = Reader(data)
    offset = r.int_in(0, 63)
    verify = r.flag()
    buf = r.rest()
    try:
        h = decode_header(buf, offset)
    except CodecError:
        h = None
    try:
        e = decode_entry(buf, offset, verify=verify)
    except CodecError:
        pass
    else:
        assert h is not None and (e.index, e.term, e.pos, e.magic) == (
            h.index,
            h.term,
            h.pos,
            h.magic,
        )
        assert not verify or crc32(e.body) == e.body_crc
    with contextlib.suppress(CodecError):
        decode_index_unit(buf, offset)


_SEG = 1024


def _follower_seeds() -> list[bytes]:
    out = []
    for end_pos, n in ((0, 3), (900, 4), (_SEG - 60, 1)):
        runs, _, _, _ = encode_leader_runs(
            [bytes([i]) * (10 + 30 * i) for i in range(n)],
            term=2,
            magic=1,
            first_index=7,
            end_pos=end_pos,
            prev_chain=0,
            segment_size=_SEG,
            hooks=(),
        )
        raw = b"".join(bytes(b) for _, b in runs)
        w = Writer().uint(_SEG - 72, 2).uint(end_pos, 2).uint(7, 2).uint(2, 1)
        out.append(w.flag(False).uint(0, 4).uint(_SEG - 8 - 56, 2).raw(raw).done())
    return out


@target("follower_entries", max_len=4096, seeds=_follower_seeds)
def follower_entries(data: bytes) -> None:
    """A leader's raw entries as a follower checks them before writing
    (``split_follower_runs``): runs covering every byte, or ``StoreError``."""
    r = Reader(data)
    segment_size = r.int_in(72, 4096, 2)
    end_pos = r.uint(2)
    next_index = r.uint(2)
    prev_term = r.uint(1) - 1
    prev_chain = UNKNOWN_CHAIN if r.flag() else r.uint(4)
    max_entry_bytes = r.int_in(56, segment_size - 8, 2)
    view = memoryview(r.rest())
    try:
        runs, metas, units, _chain = split_follower_runs(
            view,
            end_pos=end_pos,
            next_index=next_index,
            prev_term=prev_term,
            prev_chain=prev_chain,
            segment_size=segment_size,
            max_entry_bytes=max_entry_bytes,
        )
    except StoreError:
        return
    assert sum(len(b) for _, b in runs) == len(view)
    assert [m.index for m in metas] == list(range(next_index, next_index + len(metas)))
    assert len(units) == 32 * len(metas)
    for m in metas:
        assert m.pos // segment_size == (m.pos + m.size - 1) // segment_size, m


# ---- currterm and checkpoint --------------------------------------------------------------


def _state_file(data: bytes, name: str, kind: type[TermVoteFile | CheckpointFile]) -> None:
    """``data`` as the state file ``name``: a value or ``MetaFileError``; a value saves
    and loads back equal."""
    with scratch_dir() as d:
        f = kind(d / name)
        f.path.write_bytes(data)
        try:
            value = f.load()
        except MetaFileError:
            return
        assert value is not None
        f.save(value)  # type: ignore[arg-type]  # (the value its own kind loaded)
        assert f.load() == value


@target(
    "currterm_file",
    max_len=256,
    seeds=lambda: [b"currTerm=7\nvoteLeader=n2\n", b"# c\ncurrTerm=0\nvoteLeader=\n"],
)
def currterm_file(data: bytes) -> None:
    """The ``currterm`` file: a term and vote, or ``MetaFileError``; what loads saves and
    loads back equal."""
    _state_file(data, "currterm", TermVoteFile)


_CHECKPOINT = (
    b"beginIndex=0\nbeginPos=0\nbeforeBeginTerm=-1\nbeforeBeginChain=0\n"
    b"committedIndex=41\ncommittedPos=3368\nendIndex=41\n"
)


@target(
    "checkpoint_file", max_len=512, seeds=lambda: [_CHECKPOINT, _CHECKPOINT + b"pendingReset=1\n"]
)
def checkpoint_file(data: bytes) -> None:
    """The store's ``checkpoint`` file: a checkpoint, or ``MetaFileError``; what loads
    saves and loads back equal."""
    _state_file(data, "checkpoint", CheckpointFile)


# ---- a whole log on disk ---------------------------------------------------------------------

_LOG_SETTINGS = StoreSettings(data_file_size=_SEG, index_file_size=32 * 16, flush="sync")


def _log_seeds() -> list[bytes]:
    """The files of real stores, in the layout ``store_recovery`` reads."""
    out = []
    for n, committed in ((9, 4), (30, 29), (0, -1)):
        with scratch_dir() as d:
            s = FileStore(d, _LOG_SETTINGS, background=False)
            if n:
                s.append_as_leader(1, [bytes([i]) * (20 + i) for i in range(n)])
            if committed >= 0:
                s.update_committed(committed)
            s.close()
            out.append(_log_layout(d))
    return out


def _log_layout(d: Path) -> bytes:
    w = Writer()
    for sub in ("data", "index"):
        files = sorted((d / sub).iterdir())[:3]
        w.uint(len(files), 1)
        for p in files:
            w.uint(int(p.name) // (_SEG if sub == "data" else 32 * 16), 1).chunk(p.read_bytes())
    cp = d / "checkpoint"
    return w.chunk(cp.read_bytes() if cp.exists() else b"").done()


@target("store_recovery", max_len=8192, seeds=_log_seeds)
def store_recovery(data: bytes) -> None:
    """A node directory's data and index segments and checkpoint, opened by ``FileStore``
    (recovery): a store whose every entry reads back whole, or a typed refusal
    (``StoreCorruptionError``, ``StoreFileError``, ``MetaFileError``)."""
    r = Reader(data)
    with scratch_dir() as d:
        for sub, size in (("data", _SEG), ("index", _LOG_SETTINGS.index_file_size)):
            (d / sub).mkdir()
            for _ in range(r.uint(1) % 4):
                start = r.uint(1) % 8 * size
                (d / sub / f"{start:020d}").write_bytes(r.chunk(size + 1))
        checkpoint = r.chunk()
        if checkpoint:
            (d / "checkpoint").write_bytes(checkpoint)
        try:
            s = FileStore(d, _LOG_SETTINGS, background=False)
        except (StoreCorruptionError, StoreFileError, MetaFileError):
            return
        try:
            assert s.ledger_begin_index - 1 <= s.committed_index <= s.ledger_end_index
            for i in range(s.ledger_begin_index, s.ledger_end_index + 1):
                try:
                    e = s.get(i)
                except (StoreCorruptionError, StoreError):
                    continue  # below the checkpoint, where recovery does not look: a read
                    # refuses a damaged entry
                assert e.index == i and zlib.crc32(e.body) == e.body_crc
                assert s.read(e.pos, BODY_OFFSET + len(e.body))[BODY_OFFSET:] == e.body
        finally:
            s.close()
