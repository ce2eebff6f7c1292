"""A child process's output, line by line, as it comes: a reader thread fills a list,
the test waits (bounded) for the next line matching a pattern. Used where a test drives
a long-running command (``ledgermq demo``) through what it prints: expectations are met
in order, each after the line that met the one before."""

from __future__ import annotations

import re
import subprocess
import threading
import time


class Lines:
    """Collects ``proc.stdout`` (text mode) until EOF; ``wait_for`` never blocks longer
    than its timeout and fails with the output so far."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None, "start the process with stdout=PIPE, text=True"
        self.proc = proc
        self.lines: list[str] = []
        self.cursor = 0  # the next expectation is looked for from this line on
        self._cond = threading.Condition()
        self._eof = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        self.proc.stdout.close()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    @property
    def text(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str]:
        """The first line after the last one matched that matches ``pattern``
        (``re.search``); the cursor moves past it."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        seen = self.cursor
        with self._cond:
            while True:
                for i in range(seen, len(self.lines)):
                    m = rx.search(self.lines[i])
                    if m:
                        self.cursor = i + 1
                        return m
                seen = max(seen, len(self.lines))
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    why = "the output ended" if self._eof else f"not within {timeout_s} s"
                    tail = "\n".join(self.lines[-60:])
                    raise AssertionError(f"no line matching {pattern!r}: {why}; output:\n{tail}")
                self._cond.wait(min(left, 1.0))

    def wait_eof(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), f"the output did not end within {timeout_s} s"
