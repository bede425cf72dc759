"""Tool calls and results in transcripts; generated calls kept for their round trips.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("messages", sa.Column("tool_calls", sa.Text))
    op.add_column("messages", sa.Column("tool_call_id", sa.Text))
    op.add_column("messages", sa.Column("raw", sa.Text))
    op.create_table(
        "generated_replies",
        sa.Column("namespace", sa.String, nullable=False),
        sa.Column("key", sa.String, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("namespace", "key"),
    )
    op.create_index("generated_replies_age", "generated_replies", ["created_at"])
