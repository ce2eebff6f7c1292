"""``Reader``: structured parameters carved off the front of a fuzz input, and ``Writer``,
its mirror, for building seeds that a target reads back exactly.

A structure-aware target reads a few numbers (which file to write, a segment size, a
split point) and takes the rest as the bytes under test, so the fuzzer explores layouts
and contents at once. Reading past the end yields zeros: every input is a valid layout.
"""

from __future__ import annotations


class Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        out = self.data[self.pos : self.pos + n]
        self.pos += len(out)
        return out

    def uint(self, n_bytes: int) -> int:
        return int.from_bytes(self.take(n_bytes).ljust(n_bytes, b"\0"), "big")

    def int_in(self, lo: int, hi: int, n_bytes: int = 1) -> int:
        """An integer in ``[lo, hi]``."""
        return lo + self.uint(n_bytes) % (hi - lo + 1)

    def flag(self) -> bool:
        return bool(self.uint(1) & 1)

    def chunk(self, max_len: int = 0xFFFF) -> bytes:
        """A u16-length-prefixed piece (at most ``max_len`` bytes)."""
        return self.take(min(self.uint(2), max_len))

    def rest(self) -> bytes:
        out = self.data[self.pos :]
        self.pos = len(self.data)
        return out


class Writer:
    """Builds inputs ``Reader`` reads back field by field (for seeds)."""

    __slots__ = ("out",)

    def __init__(self) -> None:
        self.out = bytearray()

    def uint(self, value: int, n_bytes: int) -> Writer:
        self.out += value.to_bytes(n_bytes, "big")
        return self

    def int_in(self, value: int, lo: int, n_bytes: int = 1) -> Writer:
        return self.uint(value - lo, n_bytes)

    def flag(self, value: bool) -> Writer:
        return self.uint(int(value), 1)

    def chunk(self, data: bytes) -> Writer:
        self.uint(len(data), 2)
        self.out += data
        return self

    def raw(self, data: bytes) -> Writer:
        self.out += data
        return self

    def done(self) -> bytes:
        return bytes(self.out)
