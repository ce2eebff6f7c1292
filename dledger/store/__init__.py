"""The DLedger log store: entry codec, mmap segments, the file store and its memory twin.

See docs/formats.md for the bytes and :mod:`dledger.store.file_store` for the invariants.
"""

from .base import (
    AppendHook,
    CorruptEntryError,
    LogStore,
    StoreCorruptionError,
    StoreError,
    StoreFailedError,
    StoreSettings,
    place_entry,
)
from .entry import (
    BODY_OFFSET,
    INDEX_UNIT_SIZE,
    MAGIC_BLANK,
    MAGIC_CONFIG,
    MAGIC_NOOP,
    MAGIC_NORMAL,
    CodecError,
    ConfigRecord,
    Entry,
    EntryMeta,
    crc32,
    decode_entry,
    encode_entry,
)
from .file_store import FileStore, node_dir
from .memory_store import MemoryStore
from .meta import Checkpoint, TermVote, write_atomic

__all__ = [
    "BODY_OFFSET",
    "INDEX_UNIT_SIZE",
    "MAGIC_BLANK",
    "MAGIC_CONFIG",
    "MAGIC_NOOP",
    "MAGIC_NORMAL",
    "AppendHook",
    "Checkpoint",
    "CodecError",
    "ConfigRecord",
    "CorruptEntryError",
    "Entry",
    "EntryMeta",
    "FileStore",
    "LogStore",
    "MemoryStore",
    "StoreCorruptionError",
    "StoreError",
    "StoreFailedError",
    "StoreSettings",
    "TermVote",
    "crc32",
    "decode_entry",
    "encode_entry",
    "node_dir",
    "place_entry",
    "write_atomic",
]
