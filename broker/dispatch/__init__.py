"""Dispatch: committed entries into the state built from them, on every node (RocketMQ's
``ReputMessageService`` feeding its list of ``CommitLogDispatcher``\\ s;
docs/architecture.md). One job per module:

- ``entry``: one committed entry decoded once (``Committed``) and what an applier is;
- ``walk``: ``ReputMessageService``, the walk that hands each entry to the appliers;
- ``appliers``: the replicated metadata's appliers (topics and group offsets, producer
  sessions; ``state_appliers`` registers them) and the key index's;
- ``queues``: the consume queues' applier;
- ``arrivals``: long-polling readers, woken when their queue grows (RocketMQ's
  ``MessageArrivingListener``);
- ``recovery``: the dispatch checkpoint (``StoreCheckpoint``) and a restart's recovery;
- ``snapshots``: the metadata snapshot: its bytes from the appliers' parts, taking one,
  handing it to Raft, finding the newest on a restart;
- ``service``: ``Dispatch``, what the broker holds: it puts the pieces together, runs
  the loop and its beat (the retention floor among it), and installs a leader's
  snapshot.
"""

from .service import Dispatch

__all__ = ["Dispatch"]
