"""``FlushService``: the file store's background thread, DLedger's ``FlushDataService``,
checkpoint writer and ``CleanSpaceService`` in one loop.

Every ``flush_interval_ms`` it syncs what was written (async mode: this *is* the flush;
sync mode: the data is synced already by the writer, so this syncs the index and lets the
checkpoint move); every ``checkpoint_interval_ms`` it writes the checkpoint; every
``clean_interval_ms`` it applies retention.

Crash-only: once the store has failed (a failed fsync, ``StoreFailedError``) the loop ends;
nothing it could do would make the files trustworthy again. Any other error is logged (at
most every 10 s, with a count of the ones in between) and the next beat tries again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .base import StoreFailedError, StoreSettings

log = logging.getLogger(__name__)

SLOW_FLUSH_S = 0.5  # a flush slower than this is logged: the disk is struggling
ERROR_LOG_INTERVAL_S = 10.0


class FlushService:
    """One daemon thread per store; ``stop`` ends it and waits for it."""

    def __init__(
        self,
        where: Path,
        settings: StoreSettings,
        *,
        sync: Callable[[], None],
        write_checkpoint: Callable[[], None],
        clean: Callable[[], int],
        failed: Callable[[], bool],
    ) -> None:
        self._where = where
        self._settings = settings
        self._sync = sync
        self._write_checkpoint = write_checkpoint
        self._clean = clean
        self._failed = failed
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"dledger-flush-{where.name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        s = self._settings
        tick = s.flush_interval_ms / 1000
        last_cp = last_clean = time.monotonic()
        errors_logged_at, unlogged = -1e18, 0
        while not self._stop.wait(tick):  # one beat per tick until stopped
            if self._failed():
                return  # crash-only: the node stops; nothing here can make it good
            try:
                t0 = time.monotonic()
                self._sync()
                took = time.monotonic() - t0
                if took > SLOW_FLUSH_S:
                    log.warning("flush of %s took %.0f ms", self._where, took * 1000)
                now = time.monotonic()
                if now - last_cp >= s.checkpoint_interval_ms / 1000:
                    self._write_checkpoint()
                    last_cp = now
                if now - last_clean >= s.clean_interval_ms / 1000:
                    self._clean()
                    last_clean = now
            except StoreFailedError:
                return  # logged once where it happened
            except Exception:  # keep flushing; logged (at most every 10 s) and retried
                now = time.monotonic()
                if now - errors_logged_at >= ERROR_LOG_INTERVAL_S:
                    log.exception(
                        "background flush of %s failed%s",
                        self._where,
                        f" ({unlogged} more failures since the last report)" if unlogged else "",
                    )
                    errors_logged_at, unlogged = now, 0
                else:
                    unlogged += 1
