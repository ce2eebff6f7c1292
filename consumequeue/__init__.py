"""Consume queues and the key index, built from committed entries (docs/architecture.md).

- :mod:`consumequeue.queue`: ``ConsumeQueue``, one (topic, queue_id) index of 20-byte
  units (commitlog offset, size, tags hash), lookups by queue offset and by store time;
- :mod:`consumequeue.store`: ``ConsumeQueueStore``, every queue of a node;
- :mod:`consumequeue.keyindex`: ``KeyIndex``, message keys → commitlog offsets;
- :mod:`consumequeue.filter`: the tags hash and subscription expressions.

Everything here is derived state: the broker can always delete it and re-dispatch the
committed log. It knows nothing of Raft, messages' bytes or HTTP.
"""

from .errors import ConsumeQueueError, ConsumeQueueGapError
from .filter import matches, parse_tag_expression, tags_hash
from .keyindex import KeyIndex, KeyIndexSettings, key_hash
from .queue import UNIT_SIZE, ConsumeQueue, ConsumeQueueSettings
from .store import ConsumeQueueStore, check_topic

__all__ = [
    "UNIT_SIZE",
    "ConsumeQueue",
    "ConsumeQueueError",
    "ConsumeQueueGapError",
    "ConsumeQueueSettings",
    "ConsumeQueueStore",
    "KeyIndex",
    "KeyIndexSettings",
    "check_topic",
    "key_hash",
    "matches",
    "parse_tag_expression",
    "tags_hash",
]
