"""Progress on stderr for the commands that run for a while (`simulate --fleet`, `bench`), as
`simulate` prints its own: a transient bar on a terminal, otherwise a plain line every
EVERY_S wall-clock seconds, whatever --json says (stdout stays machine-readable)."""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any

from kvscale.cli.common import err

# Plain progress lines on a stderr that is not a terminal, this often (wall-clock seconds):
# simulate's PROGRESS_EVERY_S.
EVERY_S = 10.0


class StderrProgress:
    """`update(task, done, total, line)`: on a terminal, the task's bar at done/total; otherwise
    `line` and the seconds since the start, at most once every EVERY_S."""

    def __init__(self) -> None:
        self._started = time.monotonic()
        self._last = self._started
        self._bar: Any = None
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> StderrProgress:
        if err.is_terminal:
            from rich.progress import Progress

            self._bar = Progress(console=err, transient=True)
            self._bar.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.__exit__(kind, exc, tb)

    def update(self, task: str, done: float, total: float, line: str) -> None:
        if self._bar is not None:
            if task not in self._tasks:
                self._tasks[task] = self._bar.add_task(task, total=max(total, 1e-9))
            self._bar.update(self._tasks[task], completed=min(done, total))
            return
        wall = time.monotonic()
        if wall - self._last >= EVERY_S:
            self._last = wall
            err.print(f"{line} after {wall - self._started:.0f}s", highlight=False, markup=False)
