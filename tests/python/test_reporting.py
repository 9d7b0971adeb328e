"""The rate limit on reported drops and failures (draftfeed/reporting.py), on a clock of our own."""

from __future__ import annotations

import pytest

from draftfeed.reporting import Reporter


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_at_most_burst_per_period_per_kind_then_a_count_of_the_rest():
    clock, said = Clock(), []
    reporter = Reporter(lambda kind, message: said.append((kind, message)), burst=3, period=60,
                        clock=clock)
    for i in range(10):
        reporter.report("missing", f"row {i}")
    reporter.report("mismatched", "row 99")  # another kind has its own allowance
    assert said == [("missing", "row 0"), ("missing", "row 1"), ("missing", "row 2"),
                    ("mismatched", "row 99")]
    clock.now = 61.0  # a new window: the held-back count first, then the message
    reporter.report("missing", "row 10")
    assert said[4:] == [("missing", "7 more missing message(s) not shown (at most 3 per 60 s)"),
                        ("missing", "row 10")]
    reporter.report("missing", "row 11", count=5)  # one line standing for five events
    reporter.report("missing", "row 12")
    reporter.report("missing", "row 13")
    reporter.flush()
    assert said[6:] == [("missing", "row 11"), ("missing", "row 12"),
                        ("missing", "5 more missing message(s) not shown (at most 3 per 60 s)")]
    reporter.flush()
    assert len(said) == 9  # nothing left to say


def test_bad_limits_are_refused():
    with pytest.raises(ValueError):
        Reporter(print, burst=0)
    with pytest.raises(ValueError):
        Reporter(print, period=0)
