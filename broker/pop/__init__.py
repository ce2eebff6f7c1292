"""Shared consumption (POP): a group hands each message to one consumer at a time
(docs/consuming.md). ``state.py`` is the replicated state and its rule, ``applier.py``
applies the log to it, ``service.py`` is the master's side: what to hand out, the
appends and the answers."""
