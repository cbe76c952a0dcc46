"""A GIN index on the search rows' categories (PostgreSQL), so a filtered search over many matches
narrows the rows before reading them

Revision ID: d0004
Revises: d0003
Create Date: 2026-12-07 14:40:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "d0004"
down_revision = "d0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("CREATE INDEX ix_ucap_search_categories ON ucap_search USING gin (categories)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX ix_ucap_search_categories")
