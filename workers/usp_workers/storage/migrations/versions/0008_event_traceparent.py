"""events keep the W3C trace context of the call that emitted them, so deliveries continue its
trace

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05 21:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usp_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("traceparent", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usp_events", schema=None) as batch_op:
        batch_op.drop_column("traceparent")
