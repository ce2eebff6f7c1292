"""Coverage-guided fuzzing of every decoder that reads bytes from outside the process
(issue 17, "Fuzzing"): the Raft frame decoder and the peer handshake, the entry and
message codecs, a follower's check of a leader's entries, the consume-queue and key-index
files, the ``currterm``/``checkpoint`` files, the store's recovery of its data files,
metadata snapshots and operations, the dispatch checkpoint, and every HTTP request body.

- ``targets.py``: one target per decoder, ``target(data: bytes) -> None``. A target feeds
  ``data`` (usually through ``Reader``, which carves parameters off the front) to the
  decoder and lets through only the decoder's *typed* errors; any other exception is a
  finding. Where it is cheap, a target also checks a property of what decoded (it
  encodes back to the same thing, two decoders agree).
- ``python -m tests.fuzz TARGET [libFuzzer flags]``: atheris (libFuzzer for Python) over
  one target, the product packages instrumented for coverage, with a per-input timeout
  and an RSS limit (``__main__``).
- ``regressions/<target>/``: inputs that once crashed a target, replayed by the CI test
  (``test_fuzz.py``) along with each target's seeds and a short atheris run.

Invariants: a target never writes outside its own temporary directory (on /dev/shm when
there is one) and removes it before returning; every target is deterministic for one
input, so a crash replays from its file.
"""
