"""``process_once``: claim, run, commit or release, over ``MemoryDedupe`` and stores that break.

And how :class:`WebhookReceiver` turns each :class:`Processed` into the HTTP answer the sender
sees (the MCP binding's translation is covered in ``test_mcp_binding.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from usp_receiver import JWKS, ReceivedWebhook, SigningKey, Verifier, WebhookReceiver, sign_request
from usp_receiver.dedupe import Claim, ClaimState, DedupeStore, MemoryDedupe, Processed, process_once
from usp_schemas import BOOKING_CONFIRMED_EXAMPLE

pytestmark = pytest.mark.anyio

EVENT_ID = "evt_019a2b3c4d5e7000800000000000000a"  # the one in BOOKING_CONFIRMED_EXAMPLE


class Work:
    """The work under test: counts runs; raises ``error`` when given one."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.runs = 0
        self.error = error

    async def __call__(self) -> None:
        self.runs += 1
        if self.error is not None:
            raise self.error


class FlakyStore:
    """``MemoryDedupe`` whose chosen async operations raise, as a backend outage would; optionally
    a checkpoint before each release (so an unshielded release would be cancelled)."""

    def __init__(self, *broken: str, slow_release: bool = False) -> None:
        self.inner = MemoryDedupe()
        self.broken = set(broken)
        self.slow_release = slow_release
        self.released: list[Claim] = []

    def _check(self, operation: str) -> None:
        if operation in self.broken:
            raise ConnectionError(f"store down during {operation}")

    def claim(self, event_id: str) -> Claim:
        return self.inner.claim(event_id)

    def commit(self, claim: Claim) -> None:
        self.inner.commit(claim)

    def release(self, claim: Claim) -> None:
        self.inner.release(claim)

    async def aclaim(self, event_id: str) -> Claim:
        self._check("claim")
        return await self.inner.aclaim(event_id)

    async def acommit(self, claim: Claim) -> None:
        self._check("commit")
        await self.inner.acommit(claim)

    async def arelease(self, claim: Claim) -> None:
        if self.slow_release:
            await anyio.sleep(0.01)
        self._check("release")
        self.released.append(claim)
        await self.inner.arelease(claim)


# -- each Processed value ------------------------------------------------------------------------


async def test_accepted_runs_once_and_commits() -> None:
    store, work = MemoryDedupe(), Work()
    assert await process_once(store, EVENT_ID, work) is Processed.ACCEPTED
    assert work.runs == 1
    assert store.claim(EVENT_ID).state is ClaimState.DUPLICATE


async def test_duplicate_does_not_run() -> None:
    store, work = MemoryDedupe(), Work()
    await process_once(store, EVENT_ID, work)
    assert await process_once(store, EVENT_ID, work) is Processed.DUPLICATE
    assert work.runs == 1


async def test_in_progress_does_not_run() -> None:
    store, work = MemoryDedupe(), Work()
    held = store.claim(EVENT_ID)  # another worker is on it
    assert await process_once(store, EVENT_ID, work) is Processed.IN_PROGRESS
    assert work.runs == 0
    store.commit(held)
    assert store.claim(EVENT_ID).state is ClaimState.DUPLICATE  # its claim was left alone


async def test_failed_releases_the_claim_and_logs_locally(caplog: pytest.LogCaptureFixture) -> None:
    store, work = MemoryDedupe(), Work(RuntimeError("db password=hunter2"))
    with caplog.at_level(logging.ERROR, logger="usp_receiver"):
        assert await process_once(store, EVENT_ID, work) is Processed.FAILED
    assert "hunter2" in caplog.text  # in the local log, with its traceback
    assert [r.name for r in caplog.records] == ["usp_receiver"]
    # Released: the retry runs the work again, and succeeds this time.
    work.error = None
    assert await process_once(store, EVENT_ID, work) is Processed.ACCEPTED
    assert work.runs == 2


async def test_unavailable_when_the_store_cannot_claim(caplog: pytest.LogCaptureFixture) -> None:
    store, work = FlakyStore("claim"), Work()
    with caplog.at_level(logging.ERROR, logger="usp_receiver"):
        assert await process_once(store, EVENT_ID, work) is Processed.UNAVAILABLE
    assert work.runs == 0
    assert "store down during claim" in caplog.text


# -- store failures after the claim --------------------------------------------------------------


async def test_commit_failure_is_still_accepted(caplog: pytest.LogCaptureFixture) -> None:
    """The work is done: reporting a failure would make the sender run it twice."""
    store, work = FlakyStore("commit"), Work()
    with caplog.at_level(logging.ERROR, logger="usp_receiver"):
        assert await process_once(store, EVENT_ID, work) is Processed.ACCEPTED
    assert work.runs == 1
    assert "could not record" in caplog.text
    assert store.released == []  # not released either: the claim expires with its lease
    assert store.claim(EVENT_ID).state is ClaimState.IN_PROGRESS


async def test_release_failure_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    store, work = FlakyStore("release"), Work(RuntimeError("boom"))
    with caplog.at_level(logging.ERROR, logger="usp_receiver"):
        assert await process_once(store, EVENT_ID, work) is Processed.FAILED
    assert "failed to release" in caplog.text
    assert "store down during release" in caplog.text


# -- cancellation and other BaseExceptions -------------------------------------------------------


@pytest.mark.parametrize("slow_release", [False, True], ids=["inline-release", "awaiting-release"])
async def test_cancellation_releases_the_claim(slow_release: bool) -> None:
    """Cancelled mid-run: the claim is released (shielded, even when the release itself awaits),
    the cancellation propagates, and the next delivery of the id runs the work."""
    store = FlakyStore(slow_release=slow_release)
    entered = anyio.Event()
    finished: list[Processed] = []

    async def hangs() -> None:
        entered.set()
        await anyio.sleep_forever()

    async def deliver() -> None:
        finished.append(await process_once(store, EVENT_ID, hangs))

    async with anyio.create_task_group() as tg:
        tg.start_soon(deliver)
        await entered.wait()
        tg.cancel_scope.cancel()
    assert finished == []  # cancelled: no Processed answer, the cancellation propagated
    assert [claim.event_id for claim in store.released] == [EVENT_ID]

    work = Work()
    assert await process_once(store, EVENT_ID, work) is Processed.ACCEPTED
    assert work.runs == 1


async def test_cancellation_with_a_failing_release_still_propagates() -> None:
    store = FlakyStore("release")

    async def hangs() -> None:
        await anyio.sleep_forever()

    with anyio.move_on_after(0.01) as scope:
        await process_once(store, EVENT_ID, hangs)
    assert scope.cancelled_caught


class Interrupt(BaseException):
    """Stands for KeyboardInterrupt / SystemExit without disturbing the test runner."""


async def test_base_exception_releases_and_propagates() -> None:
    store, work = MemoryDedupe(), Work(Interrupt())
    with pytest.raises(Interrupt):
        await process_once(store, EVENT_ID, work)
    assert store.claim(EVENT_ID).state is ClaimState.NEW


# -- WebhookReceiver: Processed → HTTP answer -----------------------------------------------------

KEY = SigningKey.generate()
URL = "https://platform.example/webhooks/usp"


async def _failing_handler(hook: ReceivedWebhook) -> None:
    raise RuntimeError("cannot reach the database: password=hunter2")


async def _ok_handler(hook: ReceivedWebhook) -> None:
    return None


def _setup(processed: Processed) -> tuple[DedupeStore, Callable[[ReceivedWebhook], Awaitable[None]]]:
    """A store and handler that make ``receive`` go through ``processed``."""
    if processed is Processed.UNAVAILABLE:
        return FlakyStore("claim"), _ok_handler
    store = MemoryDedupe()
    if processed is Processed.DUPLICATE:
        store.commit(store.claim(EVENT_ID))
    elif processed is Processed.IN_PROGRESS:
        store.claim(EVENT_ID)
    return store, _failing_handler if processed is Processed.FAILED else _ok_handler


# status, reason, body["status"] (2xx) or body["reason"] (problems), Retry-After
EXPECTED: dict[Processed, tuple[int, str | None, str, str | None]] = {
    Processed.ACCEPTED: (200, None, "accepted", None),
    Processed.DUPLICATE: (200, "duplicate", "duplicate", None),
    Processed.IN_PROGRESS: (409, "in_progress", "in_progress", "5"),
    Processed.FAILED: (500, "handler_failed", "handler_failed", None),
    Processed.UNAVAILABLE: (503, "dedupe_unavailable", "dedupe_unavailable", "30"),
}


def test_every_processed_value_has_an_expected_answer() -> None:
    assert set(EXPECTED) == set(Processed)


@pytest.mark.parametrize("processed", list(Processed), ids=lambda p: p.value)
async def test_receiver_maps_processed_to_status(processed: Processed) -> None:
    store, handler = _setup(processed)
    receiver = WebhookReceiver(Verifier(JWKS([KEY.public])), handler, dedupe=store)
    body = BOOKING_CONFIRMED_EXAMPLE.encode()
    headers = {"Content-Type": "application/json"}
    headers |= sign_request("POST", URL, headers, body, [KEY])

    outcome = await receiver.receive("POST", URL, headers, body)

    status, reason, label, retry_after = EXPECTED[processed]
    assert (outcome.status, outcome.reason, outcome.event_id) == (status, reason, EVENT_ID)
    assert outcome.headers.get("Retry-After") == retry_after
    body_json: dict[str, Any] = outcome.body
    if status < 400:
        assert outcome.media_type == "application/json"
        assert body_json == {"status": label, "event_id": EVENT_ID}
    else:
        assert outcome.media_type == "application/problem+json"
        assert body_json["reason"] == label
        assert body_json["status"] == status
        assert body_json["type"] == "urn:usp-webhooks:problem:" + label
        assert "hunter2" not in repr(body_json)  # the handler's text never goes back to the sender
