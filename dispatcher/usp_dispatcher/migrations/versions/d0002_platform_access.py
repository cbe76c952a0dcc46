"""platform ownership, API keys, principal-profile bindings

Revision ID: d0002
Revises: d0001
Create Date: 2026-12-02 17:47:59.198075
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import usp_core.clock

revision = "d0002"
down_revision = "d0001"
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "sched_api_keys",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("principal", sa.String(length=256), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("label", sa.String(length=200), nullable=True),
        sa.Column("created_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", usp_core.clock.UtcDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_hash"),
    )
    with op.batch_alter_table("sched_api_keys", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_sched_api_keys_principal"), ["principal"], unique=False)

    op.create_table(
        "sched_principal_profiles",
        sa.Column("principal", sa.String(length=256), nullable=False),
        sa.Column("profile", sa.String(length=2048), nullable=False),
        sa.Column("created_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("principal"),
    )
    with op.batch_alter_table("sched_principal_profiles", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_sched_principal_profiles_profile"), ["profile"], unique=False)

    with op.batch_alter_table("sched_bookings", schema=None) as batch_op:
        batch_op.add_column(sa.Column("platform_profile", sa.String(length=2048), nullable=True))
        batch_op.create_index(
            batch_op.f("ix_sched_bookings_platform_profile"), ["platform_profile"], unique=False
        )

    with op.batch_alter_table("sched_waitlist_entries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("platform_profile", sa.String(length=2048), nullable=True))
        batch_op.create_index(
            batch_op.f("ix_sched_waitlist_entries_platform_profile"), ["platform_profile"], unique=False
        )


def downgrade() -> None:

    with op.batch_alter_table("sched_waitlist_entries", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sched_waitlist_entries_platform_profile"))
        batch_op.drop_column("platform_profile")

    with op.batch_alter_table("sched_bookings", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sched_bookings_platform_profile"))
        batch_op.drop_column("platform_profile")

    with op.batch_alter_table("sched_principal_profiles", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sched_principal_profiles_profile"))

    op.drop_table("sched_principal_profiles")
    with op.batch_alter_table("sched_api_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sched_api_keys_principal"))

    op.drop_table("sched_api_keys")
