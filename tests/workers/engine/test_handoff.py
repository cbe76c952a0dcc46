"""The API's hand-off to the broker: commits coalesced under load, never delayed when idle.

``publish`` here records batches in memory (what the hand-off does with the broker is covered
by test_tasks and, end to end, test_resilience); a long ``interval`` makes "held" observable.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence

import pytest

from usp_workers.engine.handoff import HandOff

#: Seconds to wait for something that should happen at once (a generous bound, not a timing).
SOON = 10.0


class Published:
    """A publish function that records each batch and lets a test wait for the n-th one."""

    def __init__(self, fail_first: int = 0) -> None:
        self.batches: list[list[str]] = []
        self.fail_first = fail_first
        self._changed = threading.Condition()

    def __call__(self, ids: Sequence[str]) -> None:
        with self._changed:
            if self.fail_first:
                self.fail_first -= 1
                raise ConnectionError("broker down")
            self.batches.append(list(ids))
            self._changed.notify_all()

    def wait_for(self, count: int) -> list[list[str]]:
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.batches) >= count, SOON), self.batches
            return list(self.batches)


@pytest.fixture
def published() -> Published:
    return Published()


@pytest.fixture
def handoff(published: Published) -> Iterator[HandOff]:
    handoff = HandOff(published, interval=60.0, batch_size=3)
    yield handoff
    handoff.close()


def test_an_idle_hand_off_publishes_at_once_and_holds_what_follows_within_the_interval(
    handoff: HandOff, published: Published
) -> None:
    handoff(["dlv_1"])
    assert published.wait_for(1) == [["dlv_1"]], "nothing was sent before: no wait"

    handoff(["dlv_2"])
    handoff(["dlv_3", "dlv_4"][:1])
    time.sleep(0.2)
    assert published.batches == [["dlv_1"]], "held: the last hand-off is younger than the interval"

    assert handoff.flush(SOON)
    assert published.batches == [["dlv_1"], ["dlv_2", "dlv_3"]], "two commits, one message"


def test_full_batches_never_wait(handoff: HandOff, published: Published) -> None:
    handoff(["dlv_1"])
    published.wait_for(1)

    handoff(["dlv_2", "dlv_3"])
    handoff(["dlv_4", "dlv_5"])

    assert published.wait_for(2)[1] == ["dlv_2", "dlv_3", "dlv_4"], "a full batch of 3 went at once"
    time.sleep(0.2)
    assert len(published.batches) == 2, "the rest waits for the interval"
    handoff.close()
    assert published.batches[2:] == [["dlv_5"]], "closing publishes what was held"


def test_a_short_interval_coalesces_without_a_flush(published: Published) -> None:
    handoff = HandOff(published, interval=0.05, batch_size=50)
    try:
        handoff(["dlv_1"])
        published.wait_for(1)
        handoff(["dlv_2"])
        handoff(["dlv_3"])
        assert published.wait_for(2)[1] == ["dlv_2", "dlv_3"]
    finally:
        handoff.close()


def test_a_failed_publish_is_logged_and_the_next_batches_still_go(caplog: pytest.LogCaptureFixture) -> None:
    published = Published(fail_first=1)
    handoff = HandOff(published, interval=60.0, batch_size=50)
    try:
        with caplog.at_level(logging.WARNING, logger="usp_workers"):
            handoff(["dlv_1"])
            assert handoff.flush(SOON)
            assert "broker unavailable (" in caplog.text
            handoff(["dlv_2"])
            assert handoff.flush(SOON)
        assert published.batches == [["dlv_2"]]
        assert "broker available again after" in caplog.text
        assert "1 operations failed meanwhile" in caplog.text
    finally:
        handoff.close()


def test_a_closed_hand_off_refuses_more(handoff: HandOff, published: Published) -> None:
    handoff.close()
    with pytest.raises(RuntimeError, match="closed"):
        handoff(["dlv_1"])
    assert published.batches == []


def test_with_no_backlog_every_commit_goes_at_once_and_a_backlog_brings_the_wait_back(
    published: Published,
) -> None:
    """Adaptive: while the broker holds nothing the workers have not taken, waiting only adds
    latency, so each commit is published at once; once messages wait, commits are coalesced."""
    waiting = [0]
    looks: list[int] = []

    def backlog() -> int:
        looks.append(waiting[0])
        return waiting[0]

    handoff = HandOff(published, interval=60.0, batch_size=50, backlog=backlog)
    try:
        handoff(["dlv_1"])
        published.wait_for(1)
        handoff(["dlv_2"])
        assert published.wait_for(2)[1] == ["dlv_2"], "no backlog: not held for the interval"
        waiting[0] = 3
        handoff(["dlv_3"])
        published.wait_for(3)  # it was not busy at the last look: at once, and now it looks again
        handoff(["dlv_4"])
        handoff(["dlv_5"])
        time.sleep(0.2)
        assert len(published.batches) == 3, "a backlog: held for the interval"
        assert handoff.flush(SOON)
        assert published.batches[3] == ["dlv_4", "dlv_5"]
        assert looks[:3] == [0, 0, 3], "it looks after every publish"
    finally:
        handoff.close()


def test_the_messages_just_published_are_not_a_backlog(published: Published) -> None:
    """The look follows the publish at once, so the publish's own messages are usually still
    there; only more than those means the workers are behind."""
    waiting = [2]  # after the first publish: its two messages (60 ids in batches of 50)
    handoff = HandOff(published, interval=60.0, batch_size=50, backlog=lambda: waiting[0])
    try:
        handoff([f"dlv_{i}" for i in range(60)])
        published.wait_for(1)
        handoff(["dlv_next"])
        assert published.wait_for(2)[1] == ["dlv_next"], "two waiting after two sent: not behind"
        waiting[0] = 2  # after a one-message publish: one more than it sent
        handoff(["dlv_held_1"])
        time.sleep(0.2)
        assert len(published.batches) == 2, "one message more than it sent waits: coalescing"
        assert handoff.flush(SOON)
    finally:
        handoff.close()


def test_a_backlog_that_cannot_be_read_means_coalescing(published: Published) -> None:
    def broken() -> int:
        raise ConnectionError("broker down")

    handoff = HandOff(published, interval=60.0, batch_size=50, backlog=broken)
    try:
        handoff(["dlv_1"])
        published.wait_for(1)
        handoff(["dlv_2"])
        time.sleep(0.2)
        assert published.batches == [["dlv_1"]]
    finally:
        handoff.close()
