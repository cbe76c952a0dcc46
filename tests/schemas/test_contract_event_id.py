"""``new_event_id``: unique, time-ordered, monotonic within a process, and a valid ``event_id``."""

from __future__ import annotations

import re
import threading
import time

import pytest

from usp_schemas import EVENT_ID_PATTERN, event_id_millis, new_event_id
from usp_schemas import _event_id as event_id_module

UUID7_HEX = re.compile(r"^evt_[0-9a-f]{12}7[0-9a-f]{3}[89ab][0-9a-f]{15}$")


def test_ids_are_uuid7_hex_and_match_the_envelope_pattern() -> None:
    event_id = new_event_id()

    assert UUID7_HEX.match(event_id), event_id
    assert re.match(EVENT_ID_PATTERN, event_id)


def test_ten_thousand_ids_are_unique_and_sorted_in_creation_order() -> None:
    ids = [new_event_id() for _ in range(10_000)]

    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)


def test_ids_carry_the_time_they_were_made() -> None:
    before = time.time_ns() // 1_000_000
    event_id = new_event_id()
    after = time.time_ns() // 1_000_000

    assert before <= event_id_millis(event_id) <= after


def test_later_ids_sort_after_earlier_ones_across_milliseconds() -> None:
    first = new_event_id()
    time.sleep(0.003)
    second = new_event_id()

    assert first < second
    assert event_id_millis(second) > event_id_millis(first)


def test_order_survives_the_clock_stepping_back(monkeypatch: pytest.MonkeyPatch) -> None:
    first = new_event_id()
    monkeypatch.setattr(time, "time_ns", lambda: 1_000_000_000_000)  # 1970 + 11 days

    later = [new_event_id() for _ in range(3)]

    assert [first, *later] == sorted({first, *later})


def test_order_survives_exhausting_a_millisecond(monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time_ns()
    monkeypatch.setattr(time, "time_ns", lambda: now)
    first = new_event_id()
    state = event_id_module._STATE
    state._rand = event_id_module._RAND_MASK  # the next increment overflows the random bits

    second = new_event_id()

    assert first < second
    assert event_id_millis(second) == event_id_millis(first) + 1


def test_threads_never_share_an_id() -> None:
    results: list[list[str]] = [[] for _ in range(8)]

    def make(out: list[str]) -> None:
        out.extend(new_event_id() for _ in range(2_000))

    threads = [threading.Thread(target=make, args=(out,)) for out in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    every = [event_id for out in results for event_id in out]
    assert len(set(every)) == len(every)
    assert all(out == sorted(out) for out in results)


@pytest.mark.parametrize(
    "event_id", ["evt_01HX5K3V9Q8R7T6Y5W4E3D2C1B", "evt_019a2b3c4d5e6000800000000000000a", "x"]
)
def test_event_id_millis_refuses_ids_it_did_not_make(event_id: str) -> None:
    with pytest.raises(ValueError, match="not a UUIDv7 event id"):
        event_id_millis(event_id)
