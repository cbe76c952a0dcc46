"""Run a piece of work at most once per ``event_id`` (once per success), over any dedupe store.

This is the one place that turns claim / commit / release into "run the handler once": the REST
receiver (:class:`usp_receiver.WebhookReceiver`) and the MCP binding
(:class:`usp_receiver.mcp.NotificationBinding`) both call :func:`process_once` and only translate
its :class:`Processed` answer into their own (an HTTP status, a counter).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable

import anyio

from usp_receiver.dedupe._protocol import Claim, ClaimState, DedupeStore

__all__ = ["Processed", "process_once"]

logger = logging.getLogger("usp_receiver")


class Processed(enum.Enum):
    """What :func:`process_once` did with one event."""

    #: Claimed as new, the work ran and succeeded; the id is committed (or, if the commit itself
    #: failed, left to expire with its lease: the work is done, reporting a failure would make the
    #: sender run it twice).
    ACCEPTED = "accepted"
    #: Already processed: the work did not run.
    DUPLICATE = "duplicate"
    #: Someone else holds the claim right now: the work did not run, try again later.
    IN_PROGRESS = "in_progress"
    #: The work raised: the claim was released, so a redelivery runs it again.
    FAILED = "failed"
    #: The store could not be asked (it raised on claim): the work did not run, try again later.
    UNAVAILABLE = "unavailable"


async def process_once(dedupe: DedupeStore, event_id: str, run: Callable[[], Awaitable[None]]) -> Processed:
    """Claim ``event_id`` in ``dedupe``; when it is new, await ``run()`` and commit, or release the
    claim if ``run`` raises.

    Never raises an ``Exception``: store failures and the work's own failure are logged (on the
    ``usp_receiver`` logger, for local eyes only: callers must not echo them to a sender) and
    reported as :class:`Processed`. Cancellation (any ``BaseException``) while ``run`` is awaited
    releases the claim, shielded from the cancellation, and propagates.

    >>> import anyio
    >>> from usp_receiver.dedupe import MemoryDedupe
    >>> store, ran = MemoryDedupe(), []
    >>> async def work() -> None:
    ...     ran.append(1)
    >>> anyio.run(process_once, store, "evt_1", work), anyio.run(process_once, store, "evt_1", work)
    (<Processed.ACCEPTED: 'accepted'>, <Processed.DUPLICATE: 'duplicate'>)
    >>> ran
    [1]
    """
    try:
        claim = await dedupe.aclaim(event_id)
    except Exception:
        logger.exception("dedupe store unavailable: could not claim event %s", _short(event_id))
        return Processed.UNAVAILABLE
    if claim.state is ClaimState.DUPLICATE:
        logger.debug("event %s already processed", _short(event_id))
        return Processed.DUPLICATE
    if claim.state is ClaimState.IN_PROGRESS:
        logger.info("event %s is being processed elsewhere; not run", _short(event_id))
        return Processed.IN_PROGRESS
    try:
        await run()
    except Exception:
        # Local log only: the handler's text may hold PII or secrets.
        logger.exception("handler failed for event %s; claim released for a retry", _short(event_id))
        await _release(dedupe, claim)
        return Processed.FAILED
    except BaseException:
        # Cancelled (or exiting): forget the claim so that a redelivery runs the work again.
        await _release(dedupe, claim)
        raise
    try:
        # Shielded like the release: the work is done, so record it even if cancelled meanwhile.
        with anyio.CancelScope(shield=True):
            await dedupe.acommit(claim)
    except Exception:
        logger.exception("could not record event %s as processed; its claim will expire", _short(event_id))
    return Processed.ACCEPTED


async def _release(dedupe: DedupeStore, claim: Claim) -> None:
    with anyio.CancelScope(shield=True):
        try:
            await dedupe.arelease(claim)
        except Exception:
            logger.exception(
                "dedupe store failed to release event %s; the claim will expire with its lease",
                _short(claim.event_id),
            )


def _short(event_id: str) -> str:
    """``event_id`` fit for a log line: quoted (no line breaks get through) and bounded."""
    return repr(event_id[:64] + ("…" if len(event_id) > 64 else ""))
