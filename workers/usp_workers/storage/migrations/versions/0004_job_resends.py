"""jobs count how often the scheduler re-sent them without progress

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03 09:50:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usp_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("resends", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("usp_jobs", schema=None) as batch_op:
        batch_op.drop_column("resends")
