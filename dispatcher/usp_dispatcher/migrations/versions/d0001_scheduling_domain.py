"""scheduling domain

Revision ID: d0001
Revises:
Create Date: 2026-12-02 11:53:17.877341
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import usp_core.clock

revision = "d0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sched_idempotency_keys",
        sa.Column("principal", sa.String(length=256), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=False),
        sa.Column("response", sa.Text(), nullable=False),
        sa.Column("created_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("principal", "key"),
    )
    with op.batch_alter_table("sched_idempotency_keys", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_sched_idempotency_keys_created_at"), ["created_at"], unique=False
        )

    op.create_table(
        "sched_services",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("duration_minutes", sa.Integer(), nullable=False),
        sa.Column("price_amount", sa.Integer(), nullable=True),
        sa.Column("price_currency", sa.String(length=3), nullable=True),
        sa.Column("capacity", sa.Integer(), nullable=False),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("created_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("sched_services", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_sched_services_active"), ["active"], unique=False)

    op.create_table(
        "sched_slots",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("service_id", sa.String(length=128), nullable=False),
        sa.Column("start", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("end", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("capacity", sa.Integer(), nullable=False),
        sa.Column("booked", sa.Integer(), nullable=False),
        sa.Column("held", sa.Integer(), nullable=False),
        sa.Column("created_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.CheckConstraint("booked >= 0 AND held >= 0 AND booked + held <= capacity", name="seats"),
        sa.ForeignKeyConstraint(
            ["service_id"],
            ["sched_services.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("sched_slots", schema=None) as batch_op:
        batch_op.create_index("ix_sched_slots_service_start", ["service_id", "start"], unique=False)

    op.create_table(
        "sched_bookings",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("service_id", sa.String(length=128), nullable=False),
        sa.Column("slot_id", sa.String(length=128), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("buyer", sa.Text(), nullable=False),
        sa.Column("start", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("end", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("order_id", sa.String(length=128), nullable=True),
        sa.Column("correlation_id", sa.String(length=128), nullable=True),
        sa.Column("cancellation_reason", sa.String(length=500), nullable=True),
        sa.Column("created_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["service_id"],
            ["sched_services.id"],
        ),
        sa.ForeignKeyConstraint(
            ["slot_id"],
            ["sched_slots.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("sched_bookings", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_sched_bookings_service_id"), ["service_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_sched_bookings_slot_id"), ["slot_id"], unique=False)

    op.create_table(
        "sched_waitlist_entries",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("service_id", sa.String(length=128), nullable=False),
        sa.Column("window_start", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("window_end", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("buyer", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("offered_slot_id", sa.String(length=128), nullable=True),
        sa.Column("offer_expires_at", usp_core.clock.UtcDateTime(timezone=True), nullable=True),
        sa.Column("booking_id", sa.String(length=128), nullable=True),
        sa.Column("correlation_id", sa.String(length=128), nullable=True),
        sa.Column("created_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["booking_id"],
            ["sched_bookings.id"],
        ),
        sa.ForeignKeyConstraint(
            ["offered_slot_id"],
            ["sched_slots.id"],
        ),
        sa.ForeignKeyConstraint(
            ["service_id"],
            ["sched_services.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("sched_waitlist_entries", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_sched_waitlist_entries_offer_expires_at"), ["offer_expires_at"], unique=False
        )
        batch_op.create_index("ix_sched_waitlist_queue", ["service_id", "state", "created_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("sched_waitlist_entries", schema=None) as batch_op:
        batch_op.drop_index("ix_sched_waitlist_queue")
        batch_op.drop_index(batch_op.f("ix_sched_waitlist_entries_offer_expires_at"))

    op.drop_table("sched_waitlist_entries")
    with op.batch_alter_table("sched_bookings", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sched_bookings_slot_id"))
        batch_op.drop_index(batch_op.f("ix_sched_bookings_service_id"))

    op.drop_table("sched_bookings")
    with op.batch_alter_table("sched_slots", schema=None) as batch_op:
        batch_op.drop_index("ix_sched_slots_service_start")

    op.drop_table("sched_slots")
    with op.batch_alter_table("sched_services", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sched_services_active"))

    op.drop_table("sched_services")
    with op.batch_alter_table("sched_idempotency_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sched_idempotency_keys_created_at"))

    op.drop_table("sched_idempotency_keys")
