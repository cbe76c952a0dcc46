"""Subject ordering across a fleet: four Celery worker processes and a scheduler on Redis and
PostgreSQL, 200 subjects of 20 events each to an ordered subscription whose endpoint answers 500 at
random, and one worker SIGKILLed mid-run. Every subject's events are accepted in emission order,
and none is lost.
"""

from __future__ import annotations

import json
import random
import re
import threading
from collections import defaultdict
from dataclasses import dataclass, field

import anyio
import pytest
from sqlmodel import Session

from tests.workers.endpoints import Receive, Scope, Send, read_body, respond
from tests.workers.support import (
    Endpoints,
    Pipeline,
    StartRelay,
    StartWorker,
    in_flight_under_lease,
    status_counts,
    wait_all_succeeded,
    wait_for_status,
)
from usp_core.db import session
from usp_schemas import BOOKING_CONFIRMED_EXAMPLE, new_event_id
from usp_workers.engine.outbox import emit
from usp_workers.runtime import tasks
from usp_workers.storage.models import DeliveryStatus, Ordering, Subscription

SUBJECTS = 200
EVENTS_PER_SUBJECT = 20
FAILURE_RATE = 0.1


@dataclass
class FlakyRecorder:
    """Answers 500 to a random tenth of requests after 50 ms; records the event ids it accepted
    (2xx), in the order it accepted them."""

    accepted: list[str] = field(default_factory=list)
    rejected: int = 0
    rng: random.Random = field(default_factory=lambda: random.Random(20261205))
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        event_id = json.loads(await read_body(receive))["event_id"]
        await anyio.sleep(0.05)  # a real endpoint's work: the worker holds its claims meanwhile
        with self.lock:
            fail = self.rng.random() < FAILURE_RATE
            if fail:
                self.rejected += 1
            else:
                self.accepted.append(event_id)
        await respond(send, 500 if fail else 204)


def emit_rounds(pipeline: Pipeline, subjects: list[str], order: dict[str, tuple[str, int]]) -> None:
    """Round k emits every subject's k-th event (50 events per transaction)."""
    body = json.loads(BOOKING_CONFIRMED_EXAMPLE)
    pending = [(subject, k) for k in range(EVENTS_PER_SUBJECT) for subject in subjects]
    for start in range(0, len(pending), 50):
        with session(pipeline.engine) as s:
            for subject, k in pending[start : start + 50]:
                event = body | {"event_id": new_event_id(), "booking_id": subject}
                event["data"] = body["data"] | {"id": subject}
                order[emit(s, event).id] = (subject, k)
            s.commit()


@pytest.mark.parametrize("pipeline", [("redis", "postgresql")], indirect=True, ids=["redis-postgresql"])
def test_four_workers_keep_every_subjects_order_through_failures_and_a_kill(
    pipeline: Pipeline,
    start_worker: StartWorker,
    start_relay: StartRelay,
    endpoints: Endpoints,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pipeline.fields |= {
        "lease_seconds": 3.0,
        "total_timeout": 1.0,
        "connect_timeout": 1.0,
        "requeue_after_seconds": 5.0,
        "retry_schedule": (0.2,) * 40,  # a random 500 is retried, never dead
        # Nor paused: timeouts on a loaded machine among the 500s could open the breaker (30 s).
        "breaker_threshold": 0,
        "batch_size": 20,
    }
    endpoint = FlakyRecorder()
    with Session(pipeline.engine) as s:
        s.add(Subscription(url=endpoints.add("ordered", endpoint), ordering=Ordering.SUBJECT))
        s.commit()
    # The others' lease is a little longer, so the first's claims can be told apart in the
    # database: the kill below must hit a worker holding some.
    longer = {"USP_LEASE_SECONDS": "3.25"}
    workers = [start_worker(f"worker-{n}", concurrency=4, env=longer if n else None) for n in range(4)]
    relay = start_relay()
    for child in (*workers, relay):
        child.wait_ready()
    tasks.install_enqueuer(pipeline.settings)
    diagnose = [w.diagnose for w in workers]

    subjects = [f"bkg_{n:03d}" for n in range(SUBJECTS)]
    order: dict[str, tuple[str, int]] = {}
    emit_rounds(pipeline, subjects, order)
    total = SUBJECTS * EVENTS_PER_SUBJECT
    wait_for_status(pipeline.engine, DeliveryStatus.SUCCEEDED, total // 4, 120, *diagnose)
    workers[0].kill_holding(lambda: in_flight_under_lease(pipeline.engine, 3.0), 5)
    at_kill = status_counts(pipeline.engine)
    wait_all_succeeded(pipeline.engine, total, 240, *diagnose[1:], relay.output)

    sequences: dict[str, list[int]] = defaultdict(list)
    seen: set[str] = set()
    duplicates = 0
    for event_id in list(endpoint.accepted):
        if event_id in seen:  # a re-send of what the killed worker had sent and not recorded
            duplicates += 1
            continue
        seen.add(event_id)
        subject, k = order[event_id]
        sequences[subject].append(k)
    assert seen == set(order), "every event accepted"
    reclaimed = sum(int(n) for n in re.findall(r"(\d+) expired leases reclaimed", relay.output()))
    assert reclaimed > 0, f"the killed worker's deliveries came back by their lease (at the kill: {at_kill})"
    out_of_order = {s: seq for s, seq in sequences.items() if seq != list(range(EVENTS_PER_SUBJECT))}
    assert out_of_order == {}
    with capsys.disabled():
        print(
            f"\nordered fleet: {total} events over {SUBJECTS} subjects, {endpoint.rejected} answered 500,"
            f" worker killed at {at_kill}, {reclaimed} leases reclaimed, {duplicates} re-sent after the kill,"
            " every subject in order"
        )
