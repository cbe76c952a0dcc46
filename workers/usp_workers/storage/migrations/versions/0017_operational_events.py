"""operational events: each notice is announced once as the service's own event

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07 05:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usp_notices", schema=None) as batch_op:
        batch_op.add_column(sa.Column("announced", sa.Boolean(), server_default=sa.false(), nullable=False))
    # What happened before operational events existed is not news now.
    op.execute(sa.text("UPDATE usp_notices SET announced = :yes").bindparams(yes=True))


def downgrade() -> None:
    with op.batch_alter_table("usp_notices", schema=None) as batch_op:
        batch_op.drop_column("announced")
