"""Scale-out: blocks the shared tier holds, and each agent's lease (one writer at a time).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "blocks", sa.Column("shared", sa.Boolean, nullable=False, server_default=sa.false())
    )
    op.create_table(
        "agent_leases",
        sa.Column("namespace", sa.String, nullable=False),
        sa.Column("agent_id", sa.String, nullable=False),
        sa.Column("holder", sa.String, nullable=False),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("expires_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("namespace", "agent_id"),
    )
