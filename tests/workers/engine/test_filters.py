"""Payload filters: what each operator and combinator decides, why a refusal says what it says,
the checks when a filter is saved (a bad path or operator named, hostile ones refused), and the
delivery rows ``emit``, a replay and a recover's back-fill write by them."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.engine import Engine

from tests.workers.engine.test_audience import reached, subscribe
from tests.workers.support import booking_event
from usp_core.db import session
from usp_workers.engine.filters import LIMITS, FilterError, compile_filter
from usp_workers.engine.outbox import emit, refusal
from usp_workers.operations import Conflict, replay_event
from usp_workers.storage.models import EventRecord, Subscription

EVENT: dict[str, Any] = {
    "event": "booking.confirmed",
    "data": {
        "service_id": "svc_haircut_001",
        "state": "confirmed",
        "price": {"amount": 45, "currency": "EUR"},
        "buyer": {"first_name": "Alice", "email": None},
        "tags": ["vip", "first-visit"],
        "paid": True,
    },
}


@pytest.mark.parametrize(
    ("leaf", "passes"),
    [
        ({"path": "data.service_id", "eq": "svc_haircut_001"}, True),
        ({"path": "data.service_id", "eq": "svc_other"}, False),
        ({"path": "data.service_id", "ne": "svc_other"}, True),
        ({"path": "data.absent", "ne": "x"}, True),
        ({"path": "data.state", "in": ["confirmed", "completed"]}, True),
        ({"path": "data.state", "in": ["cancelled"]}, False),
        ({"path": "data.buyer.first_name", "exists": True}, True),
        ({"path": "data.buyer.email", "exists": True}, False),  # null is not there
        ({"path": "data.buyer.phone", "exists": False}, True),
        ({"path": "data.price.amount", "gte": 45}, True),
        ({"path": "data.price.amount", "gt": 45}, False),
        ({"path": "data.price.amount", "lt": 45.5}, True),
        ({"path": "data.price.amount", "lte": 44}, False),
        ({"path": "data.price.currency", "gt": 1}, False),  # a string is no number
        ({"path": "data.paid", "eq": 1}, False),  # true is not 1
        ({"path": "data.price.amount", "eq": 45.0}, True),  # but 45 is 45.0
        ({"path": "data.service_id", "prefix": "svc_hair"}, True),
        ({"path": "data.price", "prefix": "svc"}, False),
        ({"path": "data.tags.0", "eq": "vip"}, True),
        ({"path": "data.tags.5", "exists": True}, False),
    ],
)
def test_each_operator(leaf: dict[str, Any], passes: bool) -> None:
    assert compile_filter(leaf).matches(EVENT) is passes


def test_combinators_and_the_reason_a_refusal_gives() -> None:
    tree = {
        "all": [
            {"path": "data.service_id", "eq": "svc_haircut_001"},
            {"any": [{"path": "data.buyer.email", "exists": True}, {"path": "data.price.amount", "gte": 50}]},
        ]
    }
    judged = compile_filter(tree).judge(EVENT)
    assert not judged.passed
    assert judged.why == (
        "none of: data.buyer.email exists true (found null); data.price.amount gte 50 (found 45)"
    )
    assert compile_filter({"not": tree}).matches(EVENT)
    assert compile_filter({"not": {"path": "event", "eq": "booking.confirmed"}}).judge(EVENT).why == (
        'not ({"path":"event","eq":"booking.confirmed"})'
    )


@pytest.mark.parametrize(
    ("tree", "where", "says"),
    [
        ({"path": "data..x", "eq": 1}, "$.path", "is not a dotted path"),
        ({"path": "data.x", "regex": "a+"}, "$", "needs exactly one operator"),
        ({"path": "data.x", "eq": 1, "ne": 2}, "$", "needs exactly one operator"),
        ({"eq": 1}, "$", "needs a path"),
        ({"all": []}, "$.all", "non-empty list"),
        ({"all": [{"path": "a", "eq": 1}], "any": []}, "$", "stands alone"),
        ({"any": [{"path": "a", "gte": "10"}]}, "$.any[0].gte", "finite number"),
        ({"path": "a", "in": []}, "$.in", "list of 1 to"),
        ({"path": "a", "eq": {"nested": 1}}, "$.eq", "string, number, boolean or null"),
        ({"path": "a", "exists": "yes"}, "$.exists", "true or false"),
        ([{"path": "a", "eq": 1}], "$", "must be an object"),
    ],
)
def test_a_bad_filter_is_refused_naming_the_part(tree: Any, where: str, says: str) -> None:
    with pytest.raises(FilterError) as refused:
        compile_filter(tree)
    assert refused.value.where == where
    assert says in str(refused.value)


def test_hostile_filters_are_refused_before_any_work() -> None:
    deep: dict[str, Any] = {"path": "a", "eq": 1}
    for _ in range(50_000):
        deep = {"not": deep}
    with pytest.raises(FilterError, match="nests deeper than"):
        compile_filter(deep)
    wide = {"any": [{"path": "a", "eq": n} for n in range(LIMITS.nodes + 1)]}
    with pytest.raises(FilterError, match="more than 64 parts"):
        compile_filter(wide)
    with pytest.raises(FilterError, match="longer than"):
        compile_filter({"path": "a", "prefix": "x" * (LIMITS.value + 1)})
    with pytest.raises(FilterError, match="NaN"):
        compile_filter({"path": "a", "in": [float("nan")]})
    long_path = ".".join(["a"] * (LIMITS.segments + 1))
    with pytest.raises(FilterError, match="dotted path"):
        compile_filter({"path": long_path, "eq": 1})


def subscribe_filtered(engine: Engine, name: str, tree: dict[str, Any] | None) -> str:
    subscription_id = subscribe(engine, name, None)
    with session(engine) as s:
        row = s.get(Subscription, subscription_id)
        assert row is not None
        row.payload_filter = None if tree is None else compile_filter(tree).source
        s.add(row)
        s.commit()
    return subscription_id


def test_emit_writes_no_delivery_for_an_event_the_filter_refuses(database: Engine) -> None:
    everything = subscribe_filtered(database, "all", None)
    haircuts = subscribe_filtered(database, "haircuts", {"path": "data.service_id", "eq": "svc_haircut_001"})
    massages = subscribe_filtered(database, "massages", {"path": "data.service_id", "prefix": "svc_massage"})
    with session(database) as s:
        haircut = emit(s, booking_event()).id
        other = booking_event()
        other["data"]["service_id"] = other["service_id"] = "svc_massage_9"
        massage = emit(s, other).id
        s.commit()
    assert reached(database, haircut) == {everything, haircuts}
    assert reached(database, massage) == {everything, massages}

    # A replay to every subscription follows the filters; aimed at one, it says why not.
    with session(database) as s:
        replayed = replay_event(s, haircut)
    assert {subscription for _, subscription in replayed.deliveries} == {everything, haircuts}
    with session(database) as s, pytest.raises(Conflict) as refused:
        replay_event(s, haircut, subscription_id=massages)
    assert refused.value.reason == "filtered_out"
    assert 'data.service_id prefix "svc_massage" (found "svc_haircut_001")' in refused.value.detail

    with session(database) as s:
        row = s.get(Subscription, massages)
        assert row is not None
        record = s.get(EventRecord, haircut)
        assert record is not None
        why = refusal(record, row)
    assert why == 'its filter: data.service_id prefix "svc_massage" (found "svc_haircut_001")'
