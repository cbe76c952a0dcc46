"""Announcing notices as operational events: each once, and never a ``delivery.dead`` about an
operational event's own delivery (an operator's endpoint that is down would otherwise hear about
its own dead deliveries without end)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from sqlalchemy.engine import Engine
from sqlmodel import col, select

from tests.workers.engine.test_audience import subscribe
from usp_core.db import session
from usp_workers.engine import health
from usp_workers.engine.outbox import emit
from usp_workers.operations import announce_notices, masked_url
from usp_workers.storage.models import Delivery, DeliveryStatus, EventRecord

OPERATIONAL = ["subscription.*", "delivery.dead", "probe.failed"]


def test_a_dead_delivery_of_an_operational_event_is_not_announced(database: Engine) -> None:
    ops = subscribe(database, "ops", None, json.dumps(OPERATIONAL))
    with session(database) as s:
        record = emit(
            s,
            {
                "event": "subscription.recovered",
                "event_id": "evt_ops_1",
                "timestamp": "2026-12-07T05:00:00Z",
                "subscription_id": ops,
                "data": {"subscription_id": ops, "url": "https://ops.example/hooks", "state": "active"},
            },
            audience="",
        )
        s.commit()
        (delivery,) = s.exec(select(Delivery).where(col(Delivery.event_id) == record.id)).all()
        delivery.status = DeliveryStatus.DEAD
        s.add(delivery)
        s.commit()
        health.record_notice(
            s.connection(), ops, health.NOTICE_DELIVERY_DEAD, delivery.id, now=datetime.now(UTC)
        )
        s.commit()
        assert announce_notices(s) == 1
        announced = s.exec(select(EventRecord).where(col(EventRecord.event_type) == "delivery.dead")).all()
        assert announced == []
        assert announce_notices(s) == 0, "announced once"


def test_credentials_in_a_url_are_masked() -> None:
    assert masked_url("https://user:pw@hooks.example/x") == "https://***@hooks.example/x"
    assert masked_url("https://hooks.example/x?token=1") == "https://hooks.example/x?token=1"
