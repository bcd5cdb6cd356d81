"""sinks.write_dead_letters trusts the pass's own count of none: a clean batch runs no Spark job for
its dead letters (the delivery itself runs on a real stack in tests/test_hostile_input.py)."""
from __future__ import annotations

import pytest

from spark_jobs.steps import sinks


class Untouchable:
    """A frame that fails the test if anything is asked of it."""

    def __getattr__(self, name):
        raise AssertionError(f"the dead letters' frame was used ({name}) though the pass counted none")


def test_no_dead_letters_counted_means_no_job_on_the_frame():
    assert sinks.write_dead_letters(None, Untouchable(), 7, expected=0) == 0


@pytest.mark.parametrize("expected", [None, 3])
def test_any_other_count_reads_the_frame(expected):
    with pytest.raises(AssertionError, match="persist"):
        sinks.write_dead_letters(None, Untouchable(), 7, expected=expected)
