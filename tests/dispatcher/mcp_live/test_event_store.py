"""``SessionEventStore``: one session's replay buffer, bounded, and blind to every other session's
event ids."""

from __future__ import annotations

import pytest
from mcp.server.streamable_http import GET_STREAM_KEY, EventMessage
from mcp_types import JSONRPCMessage, JSONRPCNotification

from usp_dispatcher.mcp.event_store import SessionEventStore

pytestmark = pytest.mark.anyio


def note(n: int) -> JSONRPCMessage:
    return JSONRPCNotification(jsonrpc="2.0", method="usp_webhook", params={"n": n})


class Replayed:
    def __init__(self) -> None:
        self.messages: list[EventMessage] = []

    async def __call__(self, message: EventMessage) -> None:
        self.messages.append(message)

    @property
    def numbers(self) -> list[int]:
        numbers = []
        for event in self.messages:
            assert isinstance(event.message, JSONRPCNotification)
            assert event.message.params is not None
            numbers.append(event.message.params["n"])
        return numbers


async def test_replays_what_the_stream_got_after_the_id_with_the_same_ids() -> None:
    store = SessionEventStore()
    priming = await store.store_event(GET_STREAM_KEY, None)
    ids = [await store.store_event(GET_STREAM_KEY, note(n)) for n in range(4)]
    await store.store_event("7", note(99))  # a request's own stream: not the standalone one

    replayed = Replayed()
    assert await store.replay_events_after(ids[1], replayed) == GET_STREAM_KEY
    assert replayed.numbers == [2, 3]
    assert [event.event_id for event in replayed.messages] == ids[2:]

    from_priming = Replayed()
    assert await store.replay_events_after(priming, from_priming) == GET_STREAM_KEY
    assert from_priming.numbers == [0, 1, 2, 3]


async def test_what_arrives_while_the_replay_waits_on_the_client_is_replayed_too() -> None:
    store = SessionEventStore()
    start = await store.store_event(GET_STREAM_KEY, note(0))
    await store.store_event(GET_STREAM_KEY, note(1))
    replayed = Replayed()

    async def slow_client(message: EventMessage) -> None:
        await replayed(message)
        if len(replayed.messages) == 1:  # a notification comes in meanwhile
            await store.store_event(GET_STREAM_KEY, note(2))

    assert await store.replay_events_after(start, slow_client) == GET_STREAM_KEY
    assert replayed.numbers == [1, 2]


async def test_another_sessions_event_id_replays_nothing() -> None:
    ours, theirs = SessionEventStore(), SessionEventStore()
    for n in range(3):
        await ours.store_event(GET_STREAM_KEY, note(n))
    their_ids = [await theirs.store_event(GET_STREAM_KEY, note(100 + n)) for n in range(3)]

    replayed = Replayed()
    for event_id in their_ids:
        assert await ours.replay_events_after(event_id, replayed) is None
    assert replayed.messages == []


@pytest.mark.parametrize(
    "forged", ["", "garbage", "x.1.X0dFVF9zdHJlYW0", "{token}.99.X0dFVF9zdHJlYW0", "{token}.²"]
)
async def test_ids_it_did_not_mint_replay_nothing(forged: str) -> None:
    store = SessionEventStore()
    first = await store.store_event(GET_STREAM_KEY, note(0))
    await store.store_event(GET_STREAM_KEY, note(1))
    token = first.partition(".")[0]

    replayed = Replayed()
    assert await store.replay_events_after(forged.replace("{token}", token), replayed) is None
    assert replayed.messages == []


async def test_bounded_in_size_and_a_client_behind_the_bound_stays_on_its_stream() -> None:
    store = SessionEventStore(max_events=3)
    ids = [await store.store_event(GET_STREAM_KEY, note(n)) for n in range(6)]
    assert store.held == 3

    replayed = Replayed()
    assert await store.replay_events_after(ids[0], replayed) == GET_STREAM_KEY
    assert replayed.numbers == [3, 4, 5]  # 1 and 2 are gone: the REST path has them


async def test_bounded_in_age() -> None:
    now = [0.0]
    store = SessionEventStore(max_age=300, clock=lambda: now[0])
    old = await store.store_event(GET_STREAM_KEY, note(0))
    await store.store_event(GET_STREAM_KEY, note(1))
    now[0] = 200
    await store.store_event(GET_STREAM_KEY, note(2))
    now[0] = 301
    assert store.held == 1

    replayed = Replayed()
    assert await store.replay_events_after(old, replayed) == GET_STREAM_KEY
    assert replayed.numbers == [2]


def test_an_empty_store_is_still_a_store() -> None:
    """The SDK stores only ``if event_store:``; an empty store that read as false stored nothing."""
    assert SessionEventStore()


def test_limits_must_make_sense() -> None:
    with pytest.raises(ValueError, match="max_events must be at least 1"):
        SessionEventStore(max_events=0)
    with pytest.raises(ValueError, match="max_events must be at least 1"):
        SessionEventStore(max_age=0)
