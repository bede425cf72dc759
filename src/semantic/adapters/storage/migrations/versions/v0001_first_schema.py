"""Agents, blocks, each agent's block list and transcripts (schema version 1 before Alembic).

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "agents",
        sa.Column("namespace", sa.String, nullable=False),
        sa.Column("agent_id", sa.String, nullable=False),
        sa.Column("system_prompt", sa.Text),
        sa.Column("anonymous", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("token_count", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("last_used", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("namespace", "agent_id"),
    )
    op.create_table(
        "blocks",
        sa.Column("key", sa.String, primary_key=True),
        sa.Column("parent_key", sa.String, nullable=False),
        sa.Column("namespace", sa.String, nullable=False),
        sa.Column("n_tokens", sa.Integer, nullable=False),
        sa.Column("tokens", sa.LargeBinary, nullable=False),
        sa.Column("nbytes", sa.Integer, nullable=False),
        sa.Column("checksum", sa.String, nullable=False),
        sa.Column("ref_count", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("tier", sa.String, nullable=False, server_default="disk"),
        sa.Column("created_at", sa.Double, nullable=False),
    )
    op.create_index("blocks_parent", "blocks", ["parent_key"])
    op.create_table(
        "agent_blocks",
        sa.Column("namespace", sa.String, nullable=False),
        sa.Column("agent_id", sa.String, nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("block_key", sa.String, sa.ForeignKey("blocks.key"), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "agent_id", "position"),
    )
    op.create_index("agent_blocks_key", "agent_blocks", ["block_key"])
    op.create_table(
        "messages",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("namespace", sa.String, nullable=False),
        sa.Column("agent_id", sa.String, nullable=False),
        sa.Column("role", sa.String, nullable=False),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sqlite_autoincrement=True,  # ids never reused, as the SQL before Alembic made them
    )
    op.create_index("messages_agent", "messages", ["namespace", "agent_id", "id"])
