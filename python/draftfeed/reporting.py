"""Telling people what went wrong with samples, without flooding the log.

The engine's threads never call into Python: a dropped sample travels with its batch
(`Batch.drop_messages`, `Batch.dropped`) and an online source keeps its warnings (failed round trips,
exhausted rows, recoveries) until the loader takes them (`take_messages()`). The loader reports both
from the consumer's thread through a `Reporter`: at most `burst` messages of one kind per `period`
seconds, the rest counted and summed up once the kind may speak again (or at `flush()`), so a cache
that is bad throughout or a server that is down for an hour costs a few lines a minute, not one per
sample.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class _Window:
    start: float
    said: int = 0
    held: int = 0  # messages of this kind not said in this window


class Reporter:
    """Rate-limited reporting per kind; `emit(kind, message)` says one line."""

    def __init__(
        self,
        emit: Callable[[str, str], None],
        *,
        burst: int = 20,
        period: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if burst < 1 or period <= 0:
            raise ValueError(f"burst must be >= 1 and period > 0, got {burst} and {period}")
        self._emit = emit
        self._burst = burst
        self._period = period
        self._clock = clock
        self._windows: dict[str, _Window] = {}

    def report(self, kind: str, message: str, count: int = 1) -> None:
        """One message of `kind` (standing for `count` events: an overflowed queue says how many
        it lost)."""
        now = self._clock()
        window = self._windows.get(kind)
        if window is None or now - window.start >= self._period:
            if window is not None:
                self._summarise(kind, window)
            window = self._windows[kind] = _Window(start=now)
        if window.said < self._burst:
            window.said += 1
            window.held += count - 1
            self._emit(kind, message)
        else:
            window.held += count

    def flush(self) -> None:
        """Says how many messages each kind held back, and starts afresh."""
        for kind, window in self._windows.items():
            self._summarise(kind, window)
        self._windows.clear()

    def _summarise(self, kind: str, window: _Window) -> None:
        if window.held:
            self._emit(
                kind,
                f"{window.held} more {kind} message(s) not shown (at most {self._burst} per "
                f"{self._period:g} s)",
            )
            window.held = 0


def report_drops(reporter: Reporter, batch: Any, silent: tuple[str, ...]) -> None:
    """A batch's dropped samples (`Batch.dropped`, `Batch.drop_messages`), each said with its
    reason but those of the kinds in `silent`; a drop without a message of its own is counted."""
    notes: dict[str, list[str]] = {}
    for reason, message in batch.drop_messages:
        notes.setdefault(reason, []).append(message)
    for reason, count in batch.dropped.items():
        if count == 0 or reason in silent:
            continue
        messages = notes.get(reason) or [f"batch {batch.index}: {count} sample(s) dropped ({reason})"]
        for i, message in enumerate(messages):
            extra = count - len(messages) if i == len(messages) - 1 else 0
            reporter.report(reason, message, count=1 + max(0, extra))


def report_source_messages(reporter: Reporter, source: Any) -> None:
    """What an online source kept to say (`take_messages()`), unless it was built not to log."""
    take = getattr(source, "take_messages", None)
    if take is None or not getattr(source, "log_failures", True):
        return
    messages, overflowed = take()
    for message in messages:
        reporter.report("generation", message)
    if overflowed:
        reporter.report(
            "generation", f"{overflowed} earlier warning(s) of the online source were lost "
            "(its queue is bounded)", count=overflowed)
