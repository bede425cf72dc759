"""An agent's retention hints: priority, TTL in memory, pinned on disk (ADR 0028).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("agents", sa.Column("retention", sa.Text))
