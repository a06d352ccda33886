"""Run slow work once the user stops moving a slider.

Inside a Jupyter kernel the asyncio loop is running, so a call is postponed
by ``delay`` seconds and every newer call replaces the pending one. Without a
running loop (scripts, tests) or with ``delay=0`` the call runs at once.

>>> calls = []
>>> d = Debouncer(calls.append, delay=0.2)
>>> d(1); d(2)                     # no event loop here: both run at once
>>> calls
[1, 2]
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

__all__ = ["Debouncer"]


class Debouncer:
    """Postpone ``fn`` until ``delay`` seconds passed without a newer call.

    Args:
        fn: the slow function.
        delay: seconds of quiet before ``fn`` runs; ``0`` runs it at once.
    """

    def __init__(self, fn: Callable[..., Any], delay: float = 0.25) -> None:
        if delay < 0:
            raise ValueError(f"delay={delay!r} is invalid: it must be >= 0 seconds.")
        self.fn = fn
        self.delay = delay
        self._handle: asyncio.TimerHandle | None = None
        self._args: tuple[tuple, dict] | None = None

    @property
    def pending(self) -> bool:
        """``True`` while a call waits to run."""
        return self._handle is not None

    def _loop(self) -> asyncio.AbstractEventLoop | None:
        if self.delay <= 0:
            return None
        try:
            return asyncio.get_running_loop()
        except RuntimeError:
            return None

    @property
    def immediate(self) -> bool:
        """``True`` when a call would run at once (no delay, or no running event loop)."""
        return self._loop() is None

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.cancel()
        loop = self._loop()
        if loop is None:
            self.fn(*args, **kwargs)
            return
        self._args = (args, kwargs)
        self._handle = loop.call_later(self.delay, self.flush)

    def cancel(self) -> None:
        """Drop the pending call, if any."""
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None
        self._args = None

    def flush(self) -> None:
        """Run the pending call now, if any."""
        if self._args is None:
            return
        args, kwargs = self._args
        self._handle = None
        self._args = None
        self.fn(*args, **kwargs)
