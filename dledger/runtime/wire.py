"""The binary wire format of the runtime: one frame per protocol message.

Every integer is big-endian. A frame is::

    offset  size  field
    ------  ----  ---------------------------------------------------------------
    0       4     length: u32, the number of bytes that follow (the frame body)
    4       4     code: i32, DLedger's RequestCode (VOTE, PUSH, APPEND, ...)
    8       1     kind: u8, 0 = request, 1 = response
    9       F     the message's int fields, one fixed struct per message class
    9+F     ...   its str fields, each u16 byte length + UTF-8 bytes, in the order
                  group, local_id, remote_id, then the class's own (leader_id, ...)
    ...     ...   at most one tail, last:
                    bytes payload        u32 length + bytes
                      (PushEntryRequest.entries, InstallSnapshotRequest.data,
                       GetResponse.entries, MetadataResponse.status_json)
                    AppendRequest.bodies    u32 count, then (u32 length + bytes) each
                    AppendResponse.positions u32 count, then i64 each

The fixed struct of each class (field: struct code; ``q`` i64, ``i`` i32, ``h`` i16,
``I`` u32, ``B`` u8) always starts with ``term: q, req_id: q``, followed by:

    VoteRequest                ledger_end_index q, ledger_end_term q, pre_vote B
    VoteResponse               vote_result B, pre_vote B
    HeartBeatRequest           -
    HeartBeatResponse          code h
    PushEntryRequest           type B, commit_index q, pre_log_index q, pre_log_term q,
                               first_index q, count i
    PushEntryResponse          code h, type B, index q, count i, begin_index q,
                               end_index q, x_term q, x_index q
    LeadershipTransferRequest  take_leadership_ledger_index q
    LeadershipTransferResponse code h
    InstallSnapshotRequest     last_included_index q, last_included_term q,
                               before_begin_chain I, next_pos q, commit_index q,
                               offset q, total q, config_index q, config_term q
    InstallSnapshotResponse    code h, last_included_index q, begin_index q, end_index q,
                               received q
    AppendRequest              -
    AppendResponse             code h, first_index q
    GetRequest                 index q, max_count i
    GetResponse                code h
    MetadataRequest            -
    MetadataResponse           code h

and the extra strings are: VoteRequest, HeartBeatRequest, PushEntryRequest,
InstallSnapshotRequest, AppendResponse and GetResponse ``leader_id``;
LeadershipTransferRequest ``transfer_id``, ``transferee_id``; InstallSnapshotRequest
then ``config`` (the configuration in force at the snapshot, JSON; empty: none);
VoteRequest, HeartBeatRequest, PushEntryRequest and InstallSnapshotRequest then
``cluster`` (the sender's cluster id; empty: not known yet); HeartBeatRequest,
PushEntryRequest and InstallSnapshotRequest then ``leader_addr`` (the leader's Raft
address, for a node whose configuration does not name it yet);
VoteResponse, HeartBeatResponse, PushEntryResponse and InstallSnapshotResponse
``incarnation`` (the answering node's data directory's, ``membership``).

Request codes are DLedger's (``RequestCode``) except INSTALL_SNAPSHOT = 51006, which is
ours: DLedger gives it no number (DLedger sends it as a PUSH type).

Invariants:

- ``(code, kind)`` names exactly one message class; enums (``VoteResult``,
  ``DLedgerCode``, ``PushType``) travel as their int value and decode back into the enum;
  a bool is a u8 that must be 0 or 1. Anything else is a ``FrameError``.
- A frame holds exactly one message: a struct, string or tail running past the frame's
  end, or bytes left over after the message, is a ``FrameError``. List counts are
  unsigned, so a count written as -1 by a signed encoder reads as 4294967295 and is
  rejected because it cannot fit in the frame.
- The bytes payload is the tail, so encoding a PushEntryRequest is ``header + entries``:
  ``encode_parts`` hands the caller's ``entries`` object back untouched (for
  ``writelines``), ``encode`` joins once; decoding copies each payload out of the receive
  buffer once.
- Terms, indexes and positions are bounded on decode: a field named ``term`` or
  ``*_term`` must be in ``[-1, MAX_TERM]``, one named ``*index`` or ``next_pos`` (and
  every AppendResponse position) in ``[-1, MAX_INDEX]``, a ``count`` in
  ``[0, 2**31)``; a frame outside is a ``FrameError``. So no peer can hand the core a
  term whose successor does not encode (2**63 - 1 did: every node's ready loop died).
- ``decode(encode(m)) == m`` for every message whose fields fit their struct codes and
  bounds and whose strings are at most 65535 UTF-8 bytes; ``encode`` raises
  ``ValueError`` for a field over its struct code or a string over 65535 bytes.

This module does no I/O: the transport feeds received bytes to a ``FrameDecoder`` and
writes what ``encode``/``encode_parts`` return.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from operator import attrgetter
from typing import Any, Final, TypeAlias

from ..codes import DLedgerCode
from ..core.messages import (
    MAX_INDEX,
    MAX_TERM,
    REQUEST_CODE_OF,
    AppendRequest,
    AppendResponse,
    ClientRequest,
    ClientResponse,
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
    RaftMessage,
    VoteRequest,
    VoteResponse,
    VoteResult,
)

__all__ = [
    "FRAME_HEADER_SIZE",
    "KIND_REQUEST",
    "KIND_RESPONSE",
    "MAX_FRAME_BYTES_DEFAULT",
    "MAX_STRING_BYTES",
    "FrameDecoder",
    "FrameError",
    "WireMessage",
    "decode",
    "encode",
    "encode_parts",
]

WireMessage: TypeAlias = RaftMessage | ClientRequest | ClientResponse
"""Every message the wire carries: the core's peer protocol and the client protocol."""

Buffer: TypeAlias = bytes | bytearray | memoryview

MAX_FRAME_BYTES_DEFAULT: Final = 64 * 1024 * 1024
"""Default bound on a frame's declared length (the bytes after the length prefix)."""

MAX_STRING_BYTES: Final = 0xFFFF
KIND_REQUEST: Final = 0
KIND_RESPONSE: Final = 1

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_CODE_KIND = struct.Struct(">iB")
_PREFIX: Final = ">IiB"  # length, code, kind
FRAME_HEADER_SIZE: Final = _U32.size + _CODE_KIND.size  # 9
_MIN_BODY: Final = _CODE_KIND.size  # 5
_U32_MAX: Final = 0xFFFFFFFF
_COMPACT_AT: Final = 64 * 1024


class FrameError(ValueError):
    """A malformed frame. The stream it came from cannot be resynchronised: close it."""


class _Tail(IntEnum):
    NONE = 0
    BYTES = 1
    BODIES = 2
    POSITIONS = 3


_Converter: TypeAlias = Callable[[int], object]


def _enum_converter(enum_cls: type[IntEnum]) -> _Converter:
    return enum_cls


def _to_bool(value: int) -> bool:
    if value == 0:
        return False
    if value == 1:
        return True
    raise ValueError(f"{value} is not a bool (0 or 1)")


@dataclass(frozen=True, slots=True)
class _Spec:
    """How one message class travels: precompiled structs and field getters."""

    cls: type[Any]
    code: int
    kind: int
    int_names: tuple[str, ...]
    head: struct.Struct  # length, code, kind, then the int fields
    fixed: struct.Struct  # the int fields alone (for decoding)
    # (index in int_names, name, fn, byte offset in the fixed struct)
    converters: tuple[tuple[int, str, _Converter, int], ...]
    # (index in int_names, name, lowest, highest, byte offset): the bounded fields
    bounds: tuple[tuple[int, str, int, int, int], ...]
    str_names: tuple[str, ...]
    tail: _Tail
    tail_name: str
    get_ints: Callable[[Any], tuple[Any, ...]]
    get_strs: Callable[[Any], tuple[str, ...]]


_COMMON_INTS: Final = (("term", "q", None), ("req_id", "q", None))
_COMMON_STRS: Final = ("group", "local_id", "remote_id")


def _bounds_of(name: str) -> tuple[int, int] | None:
    """The range a field's value must be in on decode (module docstring), if bounded."""
    if name == "term" or name.endswith("_term"):
        return -1, MAX_TERM
    if name.endswith("index") or name == "next_pos":
        return -1, MAX_INDEX
    if name in ("count", "max_count"):
        return 0, (1 << 31) - 1
    return None


def _spec(
    cls: type[Any],
    kind: int,
    ints: Sequence[tuple[str, str, _Converter | None]] = (),
    strs: Sequence[str] = (),
    *,
    tail: _Tail = _Tail.NONE,
    tail_name: str = "",
) -> _Spec:
    all_ints = (*_COMMON_INTS, *ints)
    all_strs = (*_COMMON_STRS, *strs)
    int_names = tuple(name for name, _, _ in all_ints)
    fmt = "".join(code for _, code, _ in all_ints)
    converters = tuple(
        (i, name, conv, struct.calcsize(">" + fmt[:i]))
        for i, (name, _, conv) in enumerate(all_ints)
        if conv is not None
    )
    bounds = tuple(
        (i, name, *limits, struct.calcsize(">" + fmt[:i]))
        for i, (name, _, _) in enumerate(all_ints)
        if (limits := _bounds_of(name)) is not None
    )
    return _Spec(
        cls=cls,
        code=int(REQUEST_CODE_OF[cls]),
        kind=kind,
        int_names=int_names,
        head=struct.Struct(_PREFIX + fmt),
        fixed=struct.Struct(">" + fmt),
        converters=converters,
        bounds=bounds,
        str_names=all_strs,
        tail=tail,
        tail_name=tail_name,
        get_ints=attrgetter(*int_names),
        get_strs=attrgetter(*all_strs),
    )


_VOTE_RESULT = _enum_converter(VoteResult)
_CODE = _enum_converter(DLedgerCode)
_PUSH_TYPE = _enum_converter(PushType)
_REQ, _RESP = KIND_REQUEST, KIND_RESPONSE

_SPECS: Final = (
    _spec(
        VoteRequest,
        _REQ,
        [
            ("ledger_end_index", "q", None),
            ("ledger_end_term", "q", None),
            ("pre_vote", "B", _to_bool),
        ],
        ["leader_id", "cluster"],
    ),
    _spec(
        VoteResponse,
        _RESP,
        [("vote_result", "B", _VOTE_RESULT), ("pre_vote", "B", _to_bool)],
        ["incarnation"],
    ),
    _spec(HeartBeatRequest, _REQ, strs=["leader_id", "cluster", "leader_addr"]),
    _spec(HeartBeatResponse, _RESP, [("code", "h", _CODE)], ["incarnation"]),
    _spec(
        PushEntryRequest,
        _REQ,
        [
            ("type", "B", _PUSH_TYPE),
            ("commit_index", "q", None),
            ("pre_log_index", "q", None),
            ("pre_log_term", "q", None),
            ("first_index", "q", None),
            ("count", "i", None),
        ],
        ["leader_id", "cluster", "leader_addr"],
        tail=_Tail.BYTES,
        tail_name="entries",
    ),
    _spec(
        PushEntryResponse,
        _RESP,
        [
            ("code", "h", _CODE),
            ("type", "B", _PUSH_TYPE),
            ("index", "q", None),
            ("count", "i", None),
            ("begin_index", "q", None),
            ("end_index", "q", None),
            ("x_term", "q", None),
            ("x_index", "q", None),
        ],
        ["incarnation"],
    ),
    _spec(
        LeadershipTransferRequest,
        _REQ,
        [("take_leadership_ledger_index", "q", None)],
        ["transfer_id", "transferee_id"],
    ),
    _spec(LeadershipTransferResponse, _RESP, [("code", "h", _CODE)]),
    _spec(
        InstallSnapshotRequest,
        _REQ,
        [
            ("last_included_index", "q", None),
            ("last_included_term", "q", None),
            ("before_begin_chain", "I", None),
            ("next_pos", "q", None),
            ("commit_index", "q", None),
            ("offset", "q", None),
            ("total", "q", None),
            ("config_index", "q", None),
            ("config_term", "q", None),
        ],
        ["leader_id", "config", "cluster", "leader_addr"],
        tail=_Tail.BYTES,
        tail_name="data",
    ),
    _spec(
        InstallSnapshotResponse,
        _RESP,
        [
            ("code", "h", _CODE),
            ("last_included_index", "q", None),
            ("begin_index", "q", None),
            ("end_index", "q", None),
            ("received", "q", None),
        ],
        ["incarnation"],
    ),
    _spec(AppendRequest, _REQ, tail=_Tail.BODIES, tail_name="bodies"),
    _spec(
        AppendResponse,
        _RESP,
        [("code", "h", _CODE), ("first_index", "q", None)],
        ["leader_id"],
        tail=_Tail.POSITIONS,
        tail_name="positions",
    ),
    _spec(GetRequest, _REQ, [("index", "q", None), ("max_count", "i", None)]),
    _spec(
        GetResponse,
        _RESP,
        [("code", "h", _CODE)],
        ["leader_id"],
        tail=_Tail.BYTES,
        tail_name="entries",
    ),
    _spec(MetadataRequest, _REQ),
    _spec(
        MetadataResponse, _RESP, [("code", "h", _CODE)], tail=_Tail.BYTES, tail_name="status_json"
    ),
)

_SPEC_BY_CLASS: Final[dict[type[Any], _Spec]] = {s.cls: s for s in _SPECS}
_SPEC_BY_KEY: Final[dict[tuple[int, int], _Spec]] = {(s.code, s.kind): s for s in _SPECS}
_KNOWN_CODES: Final = frozenset(s.code for s in _SPECS)

assert len(_SPEC_BY_KEY) == len(_SPECS) == len(REQUEST_CODE_OF)
assert set(_SPEC_BY_CLASS) == set(REQUEST_CODE_OF)


# ---- encoding --------------------------------------------------------------------------


def encode_parts(msg: WireMessage) -> list[bytes]:
    """``msg`` as a frame, in pieces whose concatenation is the frame.

    The first piece is the header (length, code, kind, fixed struct); a bytes payload
    (``entries``, ``status_json``, each of ``bodies``) is its own piece, the caller's
    object itself, so ``writer.writelines(encode_parts(m))`` never copies it.
    Raises ``ValueError`` if a field does not fit its wire type (an int out of its struct
    range, a string over 65535 UTF-8 bytes, a frame over 4 GiB) and ``TypeError`` for an
    object that is not a message.
    """
    spec = _SPEC_BY_CLASS.get(type(msg))
    if spec is None:
        raise TypeError(f"not a wire message: {type(msg).__name__}")
    parts: list[bytes] = [b""]  # the header goes here once the length is known
    size = spec.head.size - _U32.size
    for name, text in zip(spec.str_names, spec.get_strs(msg), strict=True):
        raw = text.encode("utf-8")
        if len(raw) > MAX_STRING_BYTES:
            raise ValueError(
                f"cannot encode {spec.cls.__name__}.{name}: {len(raw)} UTF-8 bytes,"
                f" at most {MAX_STRING_BYTES}"
            )
        parts.append(_U16.pack(len(raw)))
        parts.append(raw)
        size += 2 + len(raw)
    tail = spec.tail
    if tail is _Tail.BYTES:
        payload: bytes = getattr(msg, spec.tail_name)
        parts.append(_U32.pack(len(payload)))
        parts.append(payload)
        size += 4 + len(payload)
    elif tail is _Tail.BODIES:
        bodies: tuple[bytes, ...] = getattr(msg, spec.tail_name)
        parts.append(_U32.pack(len(bodies)))
        size += 4
        for body in bodies:
            parts.append(_U32.pack(len(body)))
            parts.append(body)
            size += 4 + len(body)
    elif tail is _Tail.POSITIONS:
        positions: tuple[int, ...] = getattr(msg, spec.tail_name)
        try:
            packed = struct.pack(f">I{len(positions)}q", len(positions), *positions)
        except struct.error as e:
            raise ValueError(f"cannot encode {spec.cls.__name__}.positions: {e}") from e
        parts.append(packed)
        size += len(packed)
    if size > _U32_MAX:
        raise ValueError(f"cannot encode {spec.cls.__name__}: frame of {size} bytes over 4 GiB")
    try:
        parts[0] = spec.head.pack(size, spec.code, spec.kind, *spec.get_ints(msg))
    except struct.error as e:
        raise ValueError(f"cannot encode {spec.cls.__name__}: an int field is {e}") from e
    return parts


def encode(msg: WireMessage) -> bytes:
    """``msg`` as one frame, length prefix included (see ``encode_parts``)."""
    return b"".join(encode_parts(msg))


# ---- decoding --------------------------------------------------------------------------


def _truncated(what: str, need: int, at: int, left: int) -> FrameError:
    return FrameError(
        f"truncated frame: {what} needs {need} bytes at body byte {at}, only {left} left"
    )


def _decode_from(buf: Buffer, start: int, end: int) -> WireMessage:
    """Decode the frame body ``buf[start:end]``; offsets in errors are relative to start.

    Every frame passes here, so the fixed fields and the strings are checked inline; only
    a tail (a few message classes) costs a call."""
    if end - start < _MIN_BODY:
        raise _truncated("code and kind", _MIN_BODY, 0, end - start)
    code, kind = _CODE_KIND.unpack_from(buf, start)
    spec = _SPEC_BY_KEY.get((code, kind))
    if spec is None:
        if code not in _KNOWN_CODES:
            raise FrameError(f"unknown request code {code} at body byte 0")
        raise FrameError(
            f"unknown kind {kind} at body byte 4 (0 = request, 1 = response), code {code}"
        )
    off = start + _MIN_BODY
    fixed = spec.fixed
    if off + fixed.size > end:
        raise _truncated(f"{spec.cls.__name__} fields", fixed.size, off - start, end - off)
    values: list[Any] = list(fixed.unpack_from(buf, off))
    for i, name, convert, field_off in spec.converters:
        raw = values[i]
        try:
            values[i] = convert(raw)
        except ValueError:
            at = off - start + field_off
            raise FrameError(
                f"invalid {spec.cls.__name__}.{name} {raw} at body byte {at}"
            ) from None
    for i, name, lo, hi, field_off in spec.bounds:
        if not lo <= values[i] <= hi:
            at = off - start + field_off
            raise FrameError(
                f"{spec.cls.__name__}.{name} {values[i]} at body byte {at} is outside [{lo}, {hi}]"
            )
    off += fixed.size
    kwargs: dict[str, object] = dict(zip(spec.int_names, values, strict=True))
    with memoryview(buf) as view:
        for name in spec.str_names:
            if off + 2 > end:
                raise _truncated(f"length of string {name!r}", 2, off - start, end - off)
            (n,) = _U16.unpack_from(buf, off)
            off += 2
            if off + n > end:
                raise _truncated(f"string {name!r}", n, off - start, end - off)
            try:
                kwargs[name] = str(view[off : off + n], "utf-8")
            except UnicodeDecodeError as e:
                raise FrameError(
                    f"invalid UTF-8 in string {name!r} at body byte {off - start + e.start}"
                ) from None
            off += n
        if spec.tail is not _Tail.NONE:
            kwargs[spec.tail_name], off = _decode_tail(spec, view, off, start, end)
    if off != end:
        raise FrameError(
            f"{end - off} trailing bytes after {spec.cls.__name__} at body byte {off - start}"
        )
    msg: WireMessage = spec.cls(**kwargs)
    return msg


def _decode_tail(
    spec: _Spec, view: memoryview, off: int, start: int, end: int
) -> tuple[object, int]:
    """The tail of ``spec``'s message at ``view[off:end]``: (its value, the offset after
    it). Offsets in errors are relative to ``start``, the frame body's."""
    what = spec.tail_name
    if off + 4 > end:
        raise _truncated(f"length of {what!r}", 4, off - start, end - off)
    (n,) = _U32.unpack_from(view, off)
    off += 4
    if spec.tail is _Tail.BYTES:
        if off + n > end:
            raise _truncated(repr(what), n, off - start, end - off)
        return bytes(view[off : off + n]), off + n
    if spec.tail is _Tail.BODIES:
        return _decode_bodies(what, n, view, off, start=start, end=end)
    return _decode_positions(what, n, view, off, start=start, end=end)


def _decode_bodies(
    what: str, n: int, view: memoryview, off: int, *, start: int, end: int
) -> tuple[tuple[bytes, ...], int]:
    """``n`` bodies, each a u32 length and its bytes, from ``view[off:end]``."""
    if n * 4 > end - off:  # every body needs at least its length
        raise FrameError(
            f"count {n} of {what!r} at body byte {off - start - 4} cannot fit"
            f" in the {end - off} bytes left"
        )
    bodies: list[bytes] = []
    for k in range(n):
        if off + 4 > end:
            raise _truncated(f"length of {what}[{k}]", 4, off - start, end - off)
        (m,) = _U32.unpack_from(view, off)
        off += 4
        if off + m > end:
            raise _truncated(f"{what}[{k}]", m, off - start, end - off)
        bodies.append(bytes(view[off : off + m]))
        off += m
    return tuple(bodies), off


def _decode_positions(
    what: str, n: int, view: memoryview, off: int, *, start: int, end: int
) -> tuple[tuple[int, ...], int]:
    """``n`` i64 positions from ``view[off:end]``, each in ``[-1, MAX_INDEX]``."""
    if n * 8 > end - off:
        raise FrameError(
            f"count {n} of {what!r} at body byte {off - start - 4} cannot fit"
            f" in the {end - off} bytes left"
        )
    positions: tuple[int, ...] = struct.unpack_from(f">{n}q", view, off)
    if positions and not (min(positions) >= -1 and max(positions) <= MAX_INDEX):
        raise FrameError(
            f"a position of {what!r} at body byte {off - start} is outside [-1, {MAX_INDEX}]"
        )
    return positions, off + n * 8


def decode(frame_body: Buffer) -> WireMessage:
    """Decode one frame body: a frame without its 4-byte length prefix.

    Raises ``FrameError`` if the body is not exactly one well-formed message.
    """
    return _decode_from(frame_body, 0, len(frame_body))


class FrameDecoder:
    """Incremental decoder for one byte stream (one connection).

    ``feed`` buffers partial frames and returns every message completed by the bytes fed
    so far, in order. A declared length over ``max_frame_bytes`` is rejected as soon as
    the 4-byte prefix arrives, before the body is waited for.

    After a ``FrameError`` the decoder is unusable: the stream has lost its framing, so
    every later ``feed`` raises ``FrameError`` too and the runtime closes the connection.
    Messages decoded earlier within the failing ``feed`` call are dropped with it (Raft
    and the clients retry; a dropped message is just a lost packet).

    The buffer is a bytearray read at an offset; consumed bytes are discarded when the
    buffer is fully consumed or when they are at least half of it (and at least 64 KiB),
    so each received byte is copied a bounded number of times.
    """

    __slots__ = ("_buf", "_consumed", "_error", "_frames", "_max", "_pos")

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES_DEFAULT) -> None:
        if max_frame_bytes < _MIN_BODY:
            raise ValueError(f"max_frame_bytes must be at least {_MIN_BODY}, not {max_frame_bytes}")
        self._max = max_frame_bytes
        self._buf = bytearray()
        self._pos = 0  # start of the first unconsumed byte in _buf
        self._consumed = 0  # stream offset of _buf[0]
        self._frames = 0  # frames decoded so far
        self._error: FrameError | None = None

    @property
    def max_frame_bytes(self) -> int:
        return self._max

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a decoded frame."""
        return len(self._buf) - self._pos

    @property
    def failed(self) -> bool:
        """True once a ``FrameError`` was raised (the decoder is then unusable)."""
        return self._error is not None

    def feed(self, data: Buffer) -> list[WireMessage]:
        """Add ``data`` to the stream; return the messages it completes (maybe none)."""
        if self._error is not None:
            raise FrameError(f"decoder unusable after an earlier error: {self._error}")
        buf = self._buf
        buf += data
        pos = self._pos
        end = len(buf)
        out: list[WireMessage] = []
        limit = self._max
        try:
            while end - pos >= 4:
                (n,) = _U32.unpack_from(buf, pos)
                if n > limit:
                    raise FrameError(
                        f"frame length {n} over the limit of {limit} bytes"
                        f" at stream byte {self._consumed + pos}"
                    )
                if n < _MIN_BODY:
                    raise FrameError(
                        f"frame length {n} under the minimum of {_MIN_BODY} bytes"
                        f" at stream byte {self._consumed + pos}"
                    )
                if end - pos - 4 < n:
                    break
                try:
                    out.append(_decode_from(buf, pos + 4, pos + 4 + n))
                except FrameError as e:
                    raise FrameError(
                        f"{e} (frame #{self._frames} at stream byte {self._consumed + pos})"
                    ) from e
                self._frames += 1
                pos += 4 + n
        except FrameError as e:
            self._error = e
            self._buf = bytearray()
            self._pos = 0
            raise
        if pos == end:
            buf.clear()
            self._consumed += pos
            pos = 0
        elif pos >= _COMPACT_AT and 2 * pos >= end:
            del buf[:pos]
            self._consumed += pos
            pos = 0
        self._pos = pos
        return out
