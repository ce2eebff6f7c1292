"""The runtime's wire format: round trips, incremental framing, and every malformed frame."""

from __future__ import annotations

import dataclasses
import itertools
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.codes import DLedgerCode
from dledger.core.messages import (
    MAX_INDEX,
    MAX_TERM,
    REQUEST_CODE_OF,
    AppendRequest,
    AppendResponse,
    GetRequest,
    GetResponse,
    HeartBeatRequest,
    HeartBeatResponse,
    InstallSnapshotRequest,
    InstallSnapshotResponse,
    LeadershipTransferRequest,
    LeadershipTransferResponse,
    MetadataRequest,
    MetadataResponse,
    PushEntryRequest,
    PushEntryResponse,
    PushType,
    RequestCode,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from dledger.runtime.wire import (
    FRAME_HEADER_SIZE,
    MAX_FRAME_BYTES_DEFAULT,
    FrameDecoder,
    FrameError,
    WireMessage,
    decode,
    encode,
    encode_parts,
)

# ---- strategies ------------------------------------------------------------------------

i64 = st.integers(-(2**63), 2**63 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
# What decode accepts for bounded fields (wire.py's docstring): terms, indexes, counts.
terms = st.integers(-1, MAX_TERM)
indexes = st.integers(-1, MAX_INDEX)
counts = st.integers(0, 2**31 - 1)
u32 = st.integers(0, 2**32 - 1)
ids = st.text(max_size=12)
payload = st.binary(max_size=300)


def _common() -> dict[str, Any]:
    return {"group": ids, "local_id": ids, "remote_id": ids, "term": terms, "req_id": i64}


STRATEGIES: dict[type, st.SearchStrategy[Any]] = {
    VoteRequest: st.builds(
        VoteRequest,
        **_common(),
        leader_id=ids,
        ledger_end_index=indexes,
        ledger_end_term=terms,
        pre_vote=st.booleans(),
    ),
    VoteResponse: st.builds(
        VoteResponse,
        **_common(),
        vote_result=st.sampled_from(VoteResult),
        pre_vote=st.booleans(),
    ),
    HeartBeatRequest: st.builds(HeartBeatRequest, **_common(), leader_id=ids),
    HeartBeatResponse: st.builds(HeartBeatResponse, **_common(), code=st.sampled_from(DLedgerCode)),
    PushEntryRequest: st.builds(
        PushEntryRequest,
        **_common(),
        leader_id=ids,
        type=st.sampled_from(PushType),
        commit_index=indexes,
        pre_log_index=indexes,
        pre_log_term=terms,
        first_index=indexes,
        count=counts,
        entries=payload,
    ),
    PushEntryResponse: st.builds(
        PushEntryResponse,
        **_common(),
        code=st.sampled_from(DLedgerCode),
        type=st.sampled_from(PushType),
        index=indexes,
        count=counts,
        begin_index=indexes,
        end_index=indexes,
        x_term=terms,
        x_index=indexes,
    ),
    LeadershipTransferRequest: st.builds(
        LeadershipTransferRequest,
        **_common(),
        transfer_id=ids,
        transferee_id=ids,
        take_leadership_ledger_index=indexes,
    ),
    LeadershipTransferResponse: st.builds(
        LeadershipTransferResponse, **_common(), code=st.sampled_from(DLedgerCode)
    ),
    InstallSnapshotRequest: st.builds(
        InstallSnapshotRequest,
        **_common(),
        leader_id=ids,
        last_included_index=indexes,
        last_included_term=terms,
        before_begin_chain=u32,
        next_pos=indexes,
        commit_index=indexes,
        data=payload,
    ),
    InstallSnapshotResponse: st.builds(
        InstallSnapshotResponse,
        **_common(),
        code=st.sampled_from(DLedgerCode),
        last_included_index=indexes,
        begin_index=indexes,
        end_index=indexes,
    ),
    AppendRequest: st.builds(
        AppendRequest,
        **_common(),
        bodies=st.lists(st.binary(max_size=40), max_size=8).map(tuple),
    ),
    AppendResponse: st.builds(
        AppendResponse,
        **_common(),
        code=st.sampled_from(DLedgerCode),
        leader_id=ids,
        first_index=indexes,
        positions=st.lists(indexes, max_size=8).map(tuple),
    ),
    GetRequest: st.builds(GetRequest, **_common(), index=indexes, max_count=counts),
    GetResponse: st.builds(
        GetResponse,
        **_common(),
        code=st.sampled_from(DLedgerCode),
        leader_id=ids,
        entries=payload,
    ),
    MetadataRequest: st.builds(MetadataRequest, **_common()),
    MetadataResponse: st.builds(
        MetadataResponse, **_common(), code=st.sampled_from(DLedgerCode), status_json=payload
    ),
}

any_message: st.SearchStrategy[WireMessage] = st.one_of(*STRATEGIES.values())


def _meta(**kw: Any) -> MetadataRequest:
    base: dict[str, Any] = {"group": "g", "local_id": "n0", "remote_id": "n1"}
    return MetadataRequest(**{**base, "term": 1, "req_id": 2, **kw})


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def _body(msg: WireMessage) -> bytes:
    return encode(msg)[4:]


def _feed_error(data: bytes, **kw: Any) -> str:
    with pytest.raises(FrameError) as info:
        FrameDecoder(**kw).feed(data)
    return str(info.value)


# Fixed-struct offsets in the frame body: code 4 + kind 1, then term q + req_id q.
FIXED = 5
AFTER_COMMON = FIXED + 16


# ---- round trips -----------------------------------------------------------------------


def test_every_message_class_has_a_strategy() -> None:
    assert set(STRATEGIES) == set(REQUEST_CODE_OF)


@pytest.mark.parametrize("cls", list(STRATEGIES), ids=lambda c: c.__name__)
@settings(max_examples=40)
@given(data=st.data())
def test_round_trip(cls: type, data: st.DataObject) -> None:
    msg = data.draw(STRATEGIES[cls])
    frame = encode(msg)
    (length,) = struct.unpack_from(">I", frame)
    assert length == len(frame) - 4
    code, kind = struct.unpack_from(">iB", frame, 4)
    assert code == REQUEST_CODE_OF[cls]
    assert kind == (1 if cls.__name__.endswith("Response") else 0)
    back = decode(frame[4:])
    assert back == msg
    assert type(back) is cls
    assert decode(memoryview(frame)[4:]) == msg
    assert b"".join(encode_parts(msg)) == frame


def test_enums_decode_as_enums() -> None:
    msg = PushEntryResponse(
        group="g",
        local_id="a",
        remote_id="b",
        term=1,
        req_id=1,
        code=DLedgerCode.INCONSISTENT_STATE,
        type=PushType.COMPARE,
    )
    back = decode(_body(msg))
    assert isinstance(back, PushEntryResponse)
    assert type(back.code) is DLedgerCode and back.code is DLedgerCode.INCONSISTENT_STATE
    assert type(back.type) is PushType and back.type is PushType.COMPARE
    vote = decode(_body(VoteResponse(**_ids(), term=1, req_id=1, vote_result=VoteResult.ACCEPT)))
    assert isinstance(vote, VoteResponse) and type(vote.vote_result) is VoteResult
    assert type(vote.pre_vote) is bool


def _ids() -> dict[str, Any]:
    return {"group": "g", "local_id": "a", "remote_id": "b"}


def test_push_entries_are_the_uncopied_tail() -> None:
    entries = bytes(range(256)) * 100
    msg = PushEntryRequest(
        **_ids(),
        term=5,
        req_id=9,
        leader_id="a",
        type=PushType.APPEND,
        commit_index=3,
        first_index=4,
        count=7,
        entries=entries,
    )
    parts = encode_parts(msg)
    assert parts[-1] is entries
    frame = encode(msg)
    assert frame.endswith(struct.pack(">I", len(entries)) + entries)
    assert len(frame) == len(b"".join(parts[:-1])) + len(entries)


def _install(**kw: Any) -> InstallSnapshotRequest:
    base: dict[str, Any] = {
        **_ids(),
        "term": 3,
        "req_id": 8,
        "leader_id": "a",
        "last_included_index": 99,
        "last_included_term": 2,
        "before_begin_chain": 0xDEADBEEF,
        "next_pos": 4096,
        "commit_index": 120,
        "offset": 0,
        "total": 8,
        "data": b"snapshot",
    }
    return InstallSnapshotRequest(**{**base, **kw})


def test_install_snapshot_has_its_own_request_code_51006() -> None:
    """The seeds give INSTALL_SNAPSHOT no number; ours is documented in the wire module."""
    assert RequestCode.INSTALL_SNAPSHOT == 51006
    frame = encode(_install())
    assert struct.unpack_from(">iB", frame, 4) == (51006, 0)
    resp = InstallSnapshotResponse(**_ids(), term=3, req_id=8, code=DLedgerCode.SUCCESS)
    assert struct.unpack_from(">iB", encode(resp), 4) == (51006, 1)


def test_install_snapshot_data_is_the_uncopied_tail() -> None:
    data = bytes(range(256)) * 64
    msg = _install(data=data)
    parts = encode_parts(msg)
    assert parts[-1] is data
    assert decode(encode(msg)[4:]) == msg


def test_install_snapshot_chain_is_u32() -> None:
    assert decode(_body(_install(before_begin_chain=2**32 - 1))) == _install(
        before_begin_chain=2**32 - 1
    )
    with pytest.raises(ValueError, match="InstallSnapshotRequest"):
        encode(_install(before_begin_chain=-1))
    with pytest.raises(ValueError, match="InstallSnapshotRequest"):
        encode(_install(before_begin_chain=2**32))


def test_truncated_install_snapshot_data() -> None:
    body = _body(_install(data=b"x" * 100))
    assert "truncated frame: 'data' needs 100 bytes" in _feed_error(_frame(body[:-1]))


def test_install_snapshot_response_code_out_of_range() -> None:
    resp = InstallSnapshotResponse(**_ids(), term=3, req_id=8, code=DLedgerCode.SUCCESS)
    body = bytearray(_body(resp))
    struct.pack_into(">h", body, AFTER_COMMON, 12345)
    assert "invalid InstallSnapshotResponse.code 12345" in _feed_error(_frame(bytes(body)))


def test_unicode_ids_round_trip() -> None:
    msg = HeartBeatRequest(
        group="gr\u00fcppe", local_id="\u8282\u70b9", remote_id="\U0001f600", term=1, req_id=1,
        leader_id="",
    )  # fmt: skip
    assert decode(_body(msg)) == msg


def test_encode_rejects_out_of_range_int() -> None:
    with pytest.raises(ValueError, match="MetadataRequest"):
        encode(_meta(term=2**63))
    with pytest.raises(ValueError, match="positions"):
        encode(
            AppendResponse(**_ids(), term=1, req_id=1, code=DLedgerCode.SUCCESS, positions=(2**64,))
        )


_BOUNDED = [
    (cls, f.name)
    for cls in STRATEGIES
    for f in dataclasses.fields(cls)
    if f.name == "term"
    or f.name.endswith(("_term", "index"))
    or f.name in ("next_pos", "count", "max_count")
]


@pytest.mark.parametrize(("cls", "name"), _BOUNDED, ids=[f"{c.__name__}.{n}" for c, n in _BOUNDED])
@given(data=st.data())
@settings(max_examples=20)
def test_a_term_index_or_count_outside_its_bounds_is_refused(
    cls: type, name: str, data: st.DataObject
) -> None:
    """One frame with term 2**63 - 1 used to move every node there, where term + 1 did
    not encode and the ready loop died (issue 17): bounded fields are checked on decode,
    whatever else the frame holds."""
    msg = data.draw(STRATEGIES[cls])
    lo = 0 if name in ("count", "max_count") else -1
    hi = 2**31 - 1 if name in ("count", "max_count") else MAX_TERM
    if name in ("count", "max_count"):
        bad = data.draw(st.integers(-(2**31), lo - 1))
    else:
        bad = data.draw(st.integers(-(2**63), lo - 1) | st.integers(hi + 1, 2**63 - 1))
    frame = encode(dataclasses.replace(msg, **{name: bad}))
    assert f"{cls.__name__}.{name} {bad}" in _feed_error(frame)


def test_an_append_response_position_outside_its_bounds_is_refused() -> None:
    for bad in (-2, MAX_INDEX + 1, 2**63 - 1):
        resp = AppendResponse(
            **_ids(), term=1, req_id=1, code=DLedgerCode.SUCCESS, positions=(0, bad)
        )
        assert "a position of 'positions'" in _feed_error(encode(resp))


def test_encode_rejects_string_over_65535_bytes() -> None:
    with pytest.raises(ValueError, match="group"):
        encode(_meta(group="x" * 65536))
    assert decode(_body(_meta(group="x" * 65535))) == _meta(group="x" * 65535)


def test_encode_rejects_non_message() -> None:
    with pytest.raises(TypeError):
        encode("hello")  # type: ignore[arg-type]


# ---- FrameDecoder framing -----------------------------------------------------------------


@settings(max_examples=60)
@given(
    msgs=st.lists(any_message, min_size=1, max_size=12),
    cuts=st.lists(st.integers(0, 10_000), max_size=20),
)
def test_decoder_random_chunks(msgs: list[WireMessage], cuts: list[int]) -> None:
    stream = b"".join(encode(m) for m in msgs)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    dec = FrameDecoder()
    out: list[WireMessage] = []
    for a, b in itertools.pairwise(points):
        out.extend(dec.feed(stream[a:b]))
    assert out == msgs
    assert dec.buffered == 0


def test_decoder_many_frames_in_one_chunk() -> None:
    msgs = [_meta(req_id=i) for i in range(1000)]
    assert FrameDecoder().feed(b"".join(encode(m) for m in msgs)) == msgs


def test_decoder_byte_at_a_time() -> None:
    msgs = [_meta(req_id=i, group="g" * i) for i in range(5)]
    dec = FrameDecoder()
    out: list[WireMessage] = []
    for byte in b"".join(encode(m) for m in msgs):
        out.extend(dec.feed(bytes([byte])))
    assert out == msgs


def test_decoder_partial_frame_is_buffered() -> None:
    frame = encode(_meta())
    dec = FrameDecoder()
    assert dec.feed(frame[:-1]) == []
    assert dec.buffered == len(frame) - 1
    assert dec.feed(frame[-1:] + frame[:3]) == [_meta()]
    assert dec.buffered == 3


def test_decoder_compacts_and_keeps_a_partial_frame() -> None:
    small = encode(_meta())
    big = encode(
        GetResponse(**_ids(), term=1, req_id=1, code=DLedgerCode.SUCCESS, entries=b"e" * 200_000)
    )
    stream = small * 2000 + big
    dec = FrameDecoder()
    out = dec.feed(stream[: len(small) * 2000 + 10])
    assert len(out) == 2000
    assert dec.buffered == 10
    assert dec.feed(stream[len(small) * 2000 + 10 :]) == [decode(big[4:])]
    assert dec.buffered == 0


def test_decoder_accepts_memoryview_and_bytearray() -> None:
    frame = encode(_meta())
    dec = FrameDecoder()
    assert dec.feed(memoryview(frame)[:5]) == []
    assert dec.feed(bytearray(frame[5:])) == [_meta()]


def test_max_frame_bytes_default() -> None:
    assert MAX_FRAME_BYTES_DEFAULT == 64 * 1024 * 1024
    assert FrameDecoder().max_frame_bytes == MAX_FRAME_BYTES_DEFAULT
    assert FRAME_HEADER_SIZE == 9


def test_frame_exactly_at_max_is_accepted() -> None:
    frame = encode(_meta())
    assert FrameDecoder(max_frame_bytes=len(frame) - 4).feed(frame) == [_meta()]


# ---- malformed frames ----------------------------------------------------------------------


def test_oversize_length_rejected_before_the_body_arrives() -> None:
    dec = FrameDecoder(max_frame_bytes=1000)
    assert dec.feed(b"\x00\x00") == []
    with pytest.raises(FrameError, match=r"frame length 1001 over the limit of 1000"):
        dec.feed(struct.pack(">I", 1001)[2:])
    assert dec.failed


def test_oversize_default_limit() -> None:
    msg = _feed_error(struct.pack(">I", MAX_FRAME_BYTES_DEFAULT + 1))
    assert "over the limit" in msg and "stream byte 0" in msg


def test_oversize_error_reports_stream_offset() -> None:
    frame = encode(_meta())
    msg = _feed_error(frame + struct.pack(">I", 2000), max_frame_bytes=1000)
    assert f"stream byte {len(frame)}" in msg


def test_frame_length_below_minimum() -> None:
    assert "under the minimum" in _feed_error(struct.pack(">I", 4) + b"\x00" * 4)


def test_unknown_request_code() -> None:
    body = struct.pack(">iB", 12345, 0) + _body(_meta())[5:]
    assert "unknown request code 12345" in _feed_error(_frame(body))
    with pytest.raises(FrameError, match="unknown request code 12345 at body byte 0"):
        decode(body)


def test_pull_code_has_no_message() -> None:
    body = struct.pack(">iB", RequestCode.PULL, 0) + _body(_meta())[5:]
    assert "unknown request code 51003" in _feed_error(_frame(body))


def test_unknown_kind() -> None:
    body = bytearray(_body(_meta()))
    body[4] = 2
    assert "unknown kind 2 at body byte 4" in _feed_error(_frame(bytes(body)))


def test_truncated_fixed_struct() -> None:
    body = _body(_meta())[: FIXED + 10]
    msg = _feed_error(_frame(body))
    assert "truncated frame" in msg and "MetadataRequest fields needs 16 bytes" in msg
    assert "body byte 5" in msg


def test_truncated_code_and_kind() -> None:
    with pytest.raises(FrameError, match="truncated frame: code and kind"):
        decode(b"\x00\x00\xc3")


def test_truncated_string_length() -> None:
    body = _body(_meta())[: AFTER_COMMON + 1]
    assert "length of string 'group'" in _feed_error(_frame(body))


def test_truncated_string() -> None:
    body = _body(_meta())[:AFTER_COMMON] + struct.pack(">H", 10) + b"abc"
    msg = _feed_error(_frame(body))
    assert "string 'group' needs 10 bytes at body byte 23, only 3 left" in msg


def test_truncated_payload() -> None:
    full = _body(
        GetResponse(**_ids(), term=1, req_id=1, code=DLedgerCode.SUCCESS, entries=b"x" * 50)
    )
    msg = _feed_error(_frame(full[:-1]))
    assert "'entries' needs 50 bytes" in msg and "only 49 left" in msg


def test_truncated_payload_length() -> None:
    full = _body(GetResponse(**_ids(), term=1, req_id=1, code=DLedgerCode.SUCCESS))
    assert "length of 'entries'" in _feed_error(_frame(full[:-2]))


def test_truncated_append_body() -> None:
    full = _body(AppendRequest(**_ids(), term=1, req_id=1, bodies=(b"a" * 10, b"b" * 10)))
    assert "bodies[1] needs 10 bytes" in _feed_error(_frame(full[:-3]))


def test_truncated_positions() -> None:
    full = _body(
        AppendResponse(**_ids(), term=1, req_id=1, code=DLedgerCode.SUCCESS, positions=(1, 2, 3))
    )
    assert "count 3 of 'positions'" in _feed_error(_frame(full[:-1]))


def test_trailing_bytes_inside_frame() -> None:
    msg = _feed_error(_frame(_body(_meta()) + b"\x00\x00"))
    assert "2 trailing bytes after MetadataRequest" in msg


def test_trailing_bytes_after_payload_tail() -> None:
    body = _body(GetResponse(**_ids(), term=1, req_id=1, code=DLedgerCode.SUCCESS, entries=b"xy"))
    assert "1 trailing bytes after GetResponse" in _feed_error(_frame(body + b"!"))


def test_invalid_utf8() -> None:
    good = _body(_meta(group="ab"))
    body = good[:AFTER_COMMON] + struct.pack(">H", 2) + b"\xff\xfe" + good[AFTER_COMMON + 4 :]
    msg = _feed_error(_frame(body))
    assert "invalid UTF-8 in string 'group' at body byte 23" in msg


def test_vote_result_out_of_range() -> None:
    body = bytearray(_body(VoteResponse(**_ids(), term=1, req_id=1, vote_result=VoteResult.ACCEPT)))
    body[AFTER_COMMON] = 200
    assert "invalid VoteResponse.vote_result 200 at body byte 21" in _feed_error(
        _frame(bytes(body))
    )


def test_bool_out_of_range() -> None:
    body = bytearray(_body(VoteResponse(**_ids(), term=1, req_id=1, vote_result=VoteResult.ACCEPT)))
    body[AFTER_COMMON + 1] = 2
    assert "invalid VoteResponse.pre_vote 2 at body byte 22" in _feed_error(_frame(bytes(body)))


def test_dledger_code_out_of_range() -> None:
    body = bytearray(_body(HeartBeatResponse(**_ids(), term=1, req_id=1, code=DLedgerCode.SUCCESS)))
    body[AFTER_COMMON : AFTER_COMMON + 2] = struct.pack(">h", 999)
    assert "invalid HeartBeatResponse.code 999" in _feed_error(_frame(bytes(body)))


def test_push_type_out_of_range() -> None:
    msg = PushEntryResponse(
        **_ids(), term=1, req_id=1, code=DLedgerCode.SUCCESS, type=PushType.APPEND
    )
    body = bytearray(_body(msg))
    body[AFTER_COMMON + 2] = 9  # after code h
    assert "invalid PushEntryResponse.type 9 at body byte 23" in _feed_error(_frame(bytes(body)))


def test_negative_bodies_count() -> None:
    full = _body(AppendRequest(**_ids(), term=1, req_id=1, bodies=()))
    body = full[:-4] + struct.pack(">i", -1)
    assert "count 4294967295 of 'bodies'" in _feed_error(_frame(body))


def test_negative_positions_count() -> None:
    full = _body(AppendResponse(**_ids(), term=1, req_id=1, code=DLedgerCode.SUCCESS))
    body = full[:-4] + struct.pack(">i", -1)
    assert "count 4294967295 of 'positions'" in _feed_error(_frame(body))


def test_decoder_unusable_after_error() -> None:
    dec = FrameDecoder()
    with pytest.raises(FrameError):
        dec.feed(_frame(struct.pack(">iB", 1, 0)))
    assert dec.failed
    with pytest.raises(FrameError, match="unusable"):
        dec.feed(encode(_meta()))


def test_error_names_the_frame_and_stream_offset() -> None:
    good = encode(_meta())
    msg = _feed_error(good * 2 + _frame(_body(_meta()) + b"\x00"))
    assert f"frame #2 at stream byte {2 * len(good)}" in msg


def test_decode_rejects_frame_with_length_prefix() -> None:
    with pytest.raises(FrameError):
        decode(encode(_meta()))


# ---- fuzz --------------------------------------------------------------------------------


def _fuzz(data: bytes, max_frame_bytes: int = 4096) -> None:
    dec = FrameDecoder(max_frame_bytes=max_frame_bytes)
    try:
        for i in range(0, len(data), 7):
            msgs = dec.feed(data[i : i + 7])
            assert all(type(m) in REQUEST_CODE_OF for m in msgs)
    except FrameError as e:
        assert str(e)


@settings(max_examples=300)
@given(data=st.binary(max_size=200))
def test_fuzz_arbitrary_bytes(data: bytes) -> None:
    _fuzz(data)


codes = st.sampled_from([int(c) for c in RequestCode]) | st.integers(-(2**31), 2**31 - 1)


@settings(max_examples=300)
@given(code=codes, kind=st.integers(0, 255), rest=st.binary(max_size=120))
def test_fuzz_plausible_frame_headers(code: int, kind: int, rest: bytes) -> None:
    body = struct.pack(">iB", code, kind) + rest
    _fuzz(_frame(body))


@settings(max_examples=300)
@given(msg=any_message, flips=st.lists(st.tuples(st.integers(0), st.integers(0, 255)), max_size=4))
def test_fuzz_mutated_valid_frames(msg: WireMessage, flips: list[tuple[int, int]]) -> None:
    body = bytearray(_body(msg))
    for at, value in flips:
        body[at % len(body)] = value
    _fuzz(_frame(bytes(body)), max_frame_bytes=1 << 20)
    _fuzz(bytes(body), max_frame_bytes=1 << 20)  # length prefix taken from the body


install_messages = st.one_of(
    STRATEGIES[InstallSnapshotRequest], STRATEGIES[InstallSnapshotResponse]
)


@settings(max_examples=300)
@given(
    msg=install_messages,
    flips=st.lists(st.tuples(st.integers(0), st.integers(0, 255)), max_size=4),
    cut=st.integers(0),
)
def test_fuzz_install_snapshot_frames(
    msg: WireMessage, flips: list[tuple[int, int]], cut: int
) -> None:
    """The new frames keep the property: a frame that does not parse is a FrameError
    (the connection closes), a truncated one waits for more bytes, nothing else."""
    body = bytearray(_body(msg))
    for at, value in flips:
        body[at % len(body)] = value
    _fuzz(_frame(bytes(body)), max_frame_bytes=1 << 20)
    frame = encode(msg)
    dec = FrameDecoder()
    assert dec.feed(frame[: cut % len(frame)]) == []
    assert dec.feed(frame[cut % len(frame) :]) == [msg]
