"""attempts record the key ids that signed them (what an operator checks against a platform's
JWKS cache)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05 21:15:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usp_attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("key_ids", sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usp_attempts", schema=None) as batch_op:
        batch_op.drop_column("key_ids")
