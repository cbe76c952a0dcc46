"""The catalog: listing, availability in the business's calendar, and the demo seed."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import col, select

from tests.dispatcher.conftest import MakeClient
from tests.dispatcher.scheduling.support import (
    ALICE,
    NOW,
    Catalog,
    call,
    count,
    event_types,
    events,
    ok,
    refused,
)
from usp_core import db
from usp_dispatcher.errors import InvalidRequest
from usp_dispatcher.scheduling import (
    MAX_AVAILABILITY_DAYS,
    Availability,
    ServiceSpec,
    add_slot,
    create_service,
    list_catalog,
    query_availability,
    seed_demo_catalog,
)
from usp_dispatcher.scheduling.seed import DEMO_DAYS, DEMO_SERVICES, ensure_demo_catalog
from usp_dispatcher.scheduling.tables import ServiceRow, SlotRow
from usp_schemas import SERVICE_NOT_FOUND, AvailabilityChanged, Money, ServiceCreated
from usp_workers.storage.models import EventRecord


@pytest.mark.empty_database
def test_list_catalog_shows_active_services_by_name(catalog: Catalog) -> None:
    services = call(catalog.engine, list_catalog)
    assert [s.name for s in services] == ["Cut", "Yoga"]
    cut = services[0]
    assert (cut.id, cut.duration, cut.capacity, cut.price) == (
        catalog.cut,
        "PT60M",
        1,
        Money(amount=4500, currency="USD"),
    )
    with db.session(catalog.engine) as session:
        row = session.get(ServiceRow, catalog.yoga)
        assert row is not None
        row.active = False
        session.add(row)
        session.commit()
    assert [s.name for s in call(catalog.engine, list_catalog)] == ["Cut"]
    refused(
        call(
            catalog.engine,
            lambda s: query_availability(s, catalog.yoga, date(2030, 3, 15), date(2030, 3, 15)),
        ),
        SERVICE_NOT_FOUND,
    )


def test_availability_uses_the_service_calendar_and_local_offsets(catalog: Catalog) -> None:
    # Slots at 16:00Z and 17:00Z on 2030-03-15 (12:00 and 13:00 in New York, EDT), 16:00Z on the 16th.
    found = ok(
        call(
            catalog.engine,
            lambda s: query_availability(s, catalog.cut, date(2030, 3, 15), date(2030, 3, 15), now=NOW),
        )
    )
    assert isinstance(found, Availability)
    assert [slot.id for slot in found.slots] == catalog.cut_slots[:2]
    first = found.slots[0]
    assert first.start.isoformat() == "2030-03-15T12:00:00-04:00"
    assert (first.state, first.remaining, first.capacity, first.duration) == ("available", 1, 1, "PT60M")
    both = ok(
        call(
            catalog.engine,
            lambda s: query_availability(s, catalog.cut, date(2030, 3, 15), date(2030, 3, 16), now=NOW),
        )
    )
    assert [slot.id for slot in both.slots] == catalog.cut_slots


def test_availability_day_boundary_is_local(migrated: Engine) -> None:
    # 23:30 in New York on the 15th is 03:30Z on the 16th: it belongs to the 15th.
    late = datetime(2030, 3, 16, 3, 30, tzinfo=UTC)
    with db.session(migrated) as session:
        service = create_service(
            session,
            ServiceSpec(name="Late", duration_minutes=30, timezone="America/New_York"),
            now=NOW,
            announce=False,
        )
        session.flush()
        slot = ok(add_slot(session, service.id, late, now=NOW, announce=False))
        session.commit()
    on_15th = ok(
        call(
            migrated,
            lambda s: query_availability(s, service.id, date(2030, 3, 15), date(2030, 3, 15), now=NOW),
        )
    )
    on_16th = ok(
        call(
            migrated,
            lambda s: query_availability(s, service.id, date(2030, 3, 16), date(2030, 3, 16), now=NOW),
        )
    )
    assert [x.id for x in on_15th.slots] == [slot.id]
    assert on_16th.slots == []


def test_availability_leaves_out_full_and_started_slots(catalog: Catalog) -> None:
    from usp_dispatcher.scheduling import create_booking

    ok(call(catalog.engine, lambda s: create_booking(s, catalog.cut, catalog.cut_slots[0], ALICE, now=NOW)))
    found = ok(
        call(
            catalog.engine,
            lambda s: query_availability(s, catalog.cut, date(2030, 3, 15), date(2030, 3, 16), now=NOW),
        )
    )
    assert [slot.id for slot in found.slots] == catalog.cut_slots[1:]
    later = NOW + timedelta(days=1, minutes=30)  # the second slot has not started, the first has
    found = ok(
        call(
            catalog.engine,
            lambda s: query_availability(s, catalog.cut, date(2030, 3, 15), date(2030, 3, 16), now=later),
        )
    )
    assert [slot.id for slot in found.slots] == catalog.cut_slots[1:]
    later = NOW + timedelta(days=1, hours=1)  # the second one starts now
    found = ok(
        call(
            catalog.engine,
            lambda s: query_availability(s, catalog.cut, date(2030, 3, 15), date(2030, 3, 16), now=later),
        )
    )
    assert [slot.id for slot in found.slots] == catalog.cut_slots[2:]


def test_availability_of_an_unknown_service(catalog: Catalog) -> None:
    message = refused(
        call(
            catalog.engine, lambda s: query_availability(s, "svc_nope", date(2030, 3, 15), date(2030, 3, 15))
        ),
        SERVICE_NOT_FOUND,
    )
    assert message.path == "$.service_id"
    assert message.severity == "recoverable"


@pytest.mark.parametrize(
    ("start", "end"),
    [
        (date(2030, 3, 16), date(2030, 3, 15)),
        (date(2030, 3, 1), date(2030, 3, 1) + timedelta(days=MAX_AVAILABILITY_DAYS)),
    ],
)
def test_availability_refuses_bad_ranges(catalog: Catalog, start: date, end: date) -> None:
    with pytest.raises(InvalidRequest), db.session(catalog.engine) as session:
        query_availability(session, catalog.cut, start, end)


def test_longest_allowed_range(catalog: Catalog) -> None:
    end = date(2030, 3, 1) + timedelta(days=MAX_AVAILABILITY_DAYS - 1)
    found = ok(
        call(catalog.engine, lambda s: query_availability(s, catalog.cut, date(2030, 3, 1), end, now=NOW))
    )
    assert len(found.slots) == 3


def test_creating_services_and_slots_announces_them(migrated: Engine) -> None:
    with db.session(migrated) as session:
        service = create_service(session, ServiceSpec(name="Massage", duration_minutes=90), now=NOW)
        session.flush()
        slot = ok(add_slot(session, service.id, NOW + timedelta(hours=5), capacity=2, now=NOW))
        session.commit()
    created, changed = events(migrated)
    assert isinstance(created, ServiceCreated)
    assert created.service_id == service.id
    assert created.data == service
    assert isinstance(changed, AvailabilityChanged)
    assert changed.data.slots == [slot]
    assert (slot.capacity, slot.remaining, slot.duration) == (2, 2, "PT90M")
    assert slot.end - slot.start == timedelta(minutes=90)


def test_add_slot_to_unknown_service(migrated: Engine) -> None:
    refused(
        call(migrated, lambda s: add_slot(s, "svc_nope", NOW + timedelta(hours=1), now=NOW)),
        SERVICE_NOT_FOUND,
    )
    with pytest.raises(InvalidRequest), db.session(migrated) as session:
        add_slot(session, "svc_nope", datetime(2030, 1, 1), now=NOW)  # naive


# ------------------------------------------------------------------------------------ demo seed


def slot_ids(engine: Engine) -> list[str]:
    with db.session(engine) as session:
        return list(session.exec(select(SlotRow.id).order_by(col(SlotRow.id))).all())


@pytest.mark.empty_database
def test_seed_is_idempotent_and_silent(migrated: Engine) -> None:
    assert call(migrated, lambda s: seed_demo_catalog(s, now=NOW)) == len(DEMO_SERVICES)
    first = slot_ids(migrated)
    per_day = sum(len(starts) for _spec, _tag, starts in DEMO_SERVICES)
    assert len(first) == per_day * DEMO_DAYS
    assert "slot_haircut_20300315_0900" in first  # tomorrow, 09:00 New York time
    assert call(migrated, lambda s: seed_demo_catalog(s, now=NOW + timedelta(days=3))) == 0
    assert ensure_demo_catalog(migrated) == 0
    assert slot_ids(migrated) == first
    assert count(migrated, ServiceRow) == len(DEMO_SERVICES)
    assert count(migrated, EventRecord) == 0  # the demo catalog is not news


@pytest.mark.empty_database
def test_seeded_catalog_is_bookable(migrated: Engine) -> None:
    call(migrated, lambda s: seed_demo_catalog(s, now=NOW))
    services = {s.id: s for s in call(migrated, list_catalog)}
    assert set(services) == {spec.id for spec, _tag, _starts in DEMO_SERVICES}
    assert services["svc_yoga_001"].capacity == 8
    found = ok(
        call(
            migrated,
            lambda s: query_availability(s, "svc_haircut_001", date(2030, 3, 15), date(2030, 3, 15), now=NOW),
        )
    )
    assert [slot.start.isoformat() for slot in found.slots][:2] == [
        "2030-03-15T09:00:00-04:00",
        "2030-03-15T10:00:00-04:00",
    ]
    assert len(found.slots) == 8


@pytest.mark.empty_database
def test_seed_leaves_an_existing_catalog_alone(catalog: Catalog) -> None:
    assert call(catalog.engine, lambda s: seed_demo_catalog(s, now=NOW)) == 0
    assert count(catalog.engine, ServiceRow) == 2


def test_api_seeds_on_first_start_only(make_client: MakeClient, engine: Engine) -> None:
    first = make_client().get("/services/catalog")
    assert first.status_code == 200
    assert "svc_haircut_001" in {s["id"] for s in first.json()["services"]}
    before = slot_ids(engine)
    make_client().get("/services/catalog")  # a restart
    assert slot_ids(engine) == before
    assert event_types(engine) == []
