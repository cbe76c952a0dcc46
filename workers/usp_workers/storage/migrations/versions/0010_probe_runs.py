"""probe runs: the endpoint verification battery's results, kept for the admin API

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05 21:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import usp_core.clock

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "usp_probe_runs",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("created_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("target", sa.String(length=2048), nullable=False),
        sa.Column("transport", sa.String(length=16), nullable=False),
        sa.Column("problems", sa.Integer(), nullable=False),
        sa.Column("results", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_usp_probe_runs_created_at", "usp_probe_runs", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_usp_probe_runs_created_at", table_name="usp_probe_runs")
    op.drop_table("usp_probe_runs")
