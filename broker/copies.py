"""Messages the broker holds in a system topic of its own and appends to their topic
later, as copies: delay messages (``broker/timers``) and transactions' half messages
(``broker/transactions``). The held record carries where its copy goes (RocketMQ's
``REAL_TOPIC``/``REAL_QID``, and the sharding key); the copy carries an origin property
instead, which tells the holder's applier what the copy ends."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Protocol

from .encode import NewMessage

PROP_REAL_TOPIC = "REAL_TOPIC"  # the topic the copy goes to (RocketMQ's name)
PROP_REAL_QID = "REAL_QID"  # the queue the producer pinned
PROP_SHARDING_KEY = "TIMER_SHARDING_KEY"  # the producer's sharding key
ROUTING = (PROP_REAL_TOPIC, PROP_REAL_QID, PROP_SHARDING_KEY)


class Held(Protocol):
    """What ``copy_of`` reads of a held record (``reads.PulledMessage`` has it; named
    here, not imported: the appliers import this module, and reads imports theirs)."""

    @property
    def body(self) -> bytes: ...
    @property
    def tags(self) -> str | None: ...
    @property
    def keys(self) -> list[str]: ...
    @property
    def uniq_key(self) -> str | None: ...
    @property
    def properties(self) -> dict[str, str]: ...
    @property
    def born_timestamp(self) -> int: ...


def first_pinned(*pins: Callable[[], int | None]) -> Callable[[], int | None]:
    """The dispatcher's ``pinned``: the first log position a holder still needs (the
    first pending delay message's record, the first live transaction's), None if none."""

    def pinned() -> int | None:
        return min((p for pin in pins if (p := pin()) is not None), default=None)

    return pinned


def held(
    m: NewMessage, topic: str, marks: Mapping[str, str], born_timestamp: int | None = None
) -> NewMessage:
    """``m`` as the record its holder stores (queue 0 of its system topic): its routing
    and the holder's ``marks`` added to its properties, the producer's own unique key
    kept when it brought one (a RocketMQ 5 client's message id: its copies keep it)."""
    props = {**m.properties, PROP_REAL_TOPIC: topic, **marks}
    if m.queue_id is not None:
        props[PROP_REAL_QID] = str(m.queue_id)
    if m.sharding_key is not None:
        props[PROP_SHARDING_KEY] = m.sharding_key
    return NewMessage(
        m.body,
        m.tags,
        m.keys,
        props,
        queue_id=0,
        born_timestamp=born_timestamp,
        uniq_key=m.uniq_key,
    )


def copy_of(
    m: Held, origin: tuple[str, str], drop: Collection[str] = (), *, keep_key: bool
) -> tuple[str, NewMessage]:
    """A held record as the message it delivers: (its topic, the message) into its
    pinned queue or by its sharding key, with its body, tags, keys, the producer's
    properties (less ``drop``) and born time, the unique key too with ``keep_key``, and
    ``origin`` (name, value). A copy is always a record of its own (its born time)."""
    props = {k: v for k, v in m.properties.items() if k not in ROUTING and k not in drop}
    props[origin[0]] = origin[1]
    qid = m.properties.get(PROP_REAL_QID)
    return m.properties[PROP_REAL_TOPIC], NewMessage(
        m.body,
        m.tags,
        m.keys,
        props,
        queue_id=None if qid is None else int(qid),
        sharding_key=m.properties.get(PROP_SHARDING_KEY),
        born_timestamp=m.born_timestamp,
        uniq_key=m.uniq_key if keep_key else None,
    )
