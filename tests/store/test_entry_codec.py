"""The entry and index-unit codecs: exact bytes (docs/formats.md) and round trips."""

from __future__ import annotations

import struct
import zlib

import crcmod.predefined
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dledger.store.entry import (
    BODY_OFFSET,
    INDEX_UNIT_SIZE,
    MAGIC_BLANK,
    MAGIC_NOOP,
    MAGIC_NORMAL,
    MIN_BLANK_LEN,
    CodecError,
    chain_crc,
    crc32,
    decode_entry,
    decode_header,
    decode_index_unit,
    encode_blank,
    encode_entry,
    encode_index_unit,
    peek_magic_size,
)

_crcmod_crc32 = crcmod.predefined.mkCrcFun("crc-32")


def test_header_layout_is_dledger_big_endian_48_bytes() -> None:
    raw = encode_entry(index=7, term=3, pos=4096, body=b"hello", magic=MAGIC_NORMAL)
    assert BODY_OFFSET == 48 and len(raw) == 48 + 5
    assert raw[0:4] == (1).to_bytes(4, "big")  # magic
    assert raw[4:8] == (53).to_bytes(4, "big")  # size = header + body
    assert raw[8:16] == (7).to_bytes(8, "big")  # index
    assert raw[16:24] == (3).to_bytes(8, "big")  # term
    assert raw[24:32] == (4096).to_bytes(8, "big")  # pos
    assert raw[32:36] == bytes(4)  # channel, reserved
    assert raw[40:44] == zlib.crc32(b"hello").to_bytes(4, "big")  # body crc
    assert raw[44:48] == (5).to_bytes(4, "big")  # body size
    assert raw[48:] == b"hello"


def test_magic_values_normal_1_noop_2_blank_minus_1() -> None:
    assert (MAGIC_NORMAL, MAGIC_NOOP, MAGIC_BLANK, MIN_BLANK_LEN) == (1, 2, -1, 8)


def test_chain_crc_covers_header_fields_and_previous_chain() -> None:
    a = encode_entry(0, 1, 0, b"x", prev_chain=0)
    b = encode_entry(0, 1, 0, b"x", prev_chain=12345)
    assert a[36:40] != b[36:40]
    h = decode_header(a)
    assert h.chain_crc == chain_crc(a, 0)
    changed = bytearray(a)
    changed[16:24] = (2).to_bytes(8, "big")  # a term changed in place
    assert chain_crc(changed, 0) != h.chain_crc


@given(
    index=st.integers(0, 2**62),
    term=st.integers(0, 2**62),
    pos=st.integers(0, 2**62),
    body=st.binary(max_size=2048),
    magic=st.sampled_from([MAGIC_NORMAL, MAGIC_NOOP]),
    prev=st.integers(0, 2**32 - 1),
)
def test_entry_round_trip(
    index: int, term: int, pos: int, body: bytes, magic: int, prev: int
) -> None:
    raw = encode_entry(index, term, pos, body, magic, prev_chain=prev)
    e = decode_entry(raw)
    assert (e.index, e.term, e.pos, e.magic, e.body) == (index, term, pos, magic, body)
    assert e.size == len(raw) and e.end_pos == pos + len(raw)
    assert e.chain_crc == chain_crc(raw, prev)


@given(body=st.binary(min_size=1, max_size=256), flip=st.integers(0, 10_000))
def test_decode_entry_rejects_a_flipped_body_byte(body: bytes, flip: int) -> None:
    raw = bytearray(encode_entry(1, 1, 0, body))
    raw[BODY_OFFSET + flip % len(body)] ^= 0x5A
    with pytest.raises(CodecError, match="CRC"):
        decode_entry(raw)


@pytest.mark.parametrize(
    ("offset", "value", "message"),
    [(0, 9, "magic"), (4, 1000, "size"), (32, 1, "channel")],
)
def test_decode_header_rejects_malformed_fields(offset: int, value: int, message: str) -> None:
    raw = bytearray(encode_entry(1, 1, 0, b"abc"))
    raw[offset : offset + 4] = value.to_bytes(4, "big")
    with pytest.raises(CodecError, match=message):
        decode_header(raw)


def test_decode_rejects_short_and_truncated_input() -> None:
    raw = encode_entry(1, 1, 0, b"abcdef")
    with pytest.raises(CodecError, match="short header"):
        decode_header(raw[:40])
    with pytest.raises(CodecError, match="truncated"):
        decode_entry(raw[:-1])


def test_blank_record_is_magic_minus_one_size_then_zeros() -> None:
    blank = encode_blank(20)
    assert peek_magic_size(blank, 0) == (MAGIC_BLANK, 20)
    assert blank[8:] == bytes(12)
    with pytest.raises(CodecError):
        encode_blank(7)


@given(
    magic=st.sampled_from([MAGIC_NORMAL, MAGIC_NOOP]),
    pos=st.integers(0, 2**62),
    size=st.integers(48, 2**31 - 1),
    index=st.integers(0, 2**62),
    term=st.integers(0, 2**62),
)
def test_index_unit_round_trip_32_bytes(
    magic: int, pos: int, size: int, index: int, term: int
) -> None:
    raw = encode_index_unit(magic, pos, size, index, term)
    assert len(raw) == INDEX_UNIT_SIZE == 32
    assert struct.unpack(">iqiqq", raw) == (magic, pos, size, index, term)
    u = decode_index_unit(raw)
    assert (u.magic, u.pos, u.size, u.index, u.term) == (magic, pos, size, index, term)


@given(data=st.binary(max_size=4096))
def test_zlib_crc32_agrees_with_crcmod_crc32(data: bytes) -> None:
    assert crc32(data) == _crcmod_crc32(data) == zlib.crc32(data)


def test_crc32_known_vector() -> None:
    # The CRC-32 check value (Java CRC32, crcmod "crc-32", zlib) of "123456789".
    assert crc32(b"123456789") == 0xCBF43926 == _crcmod_crc32(b"123456789")
