"""The agents API's agents are marked at creation, not known by their first message.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "agents",
        sa.Column("keeps_transcript", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    agents = sa.table(
        "agents",
        sa.column("namespace", sa.String),
        sa.column("agent_id", sa.String),
        sa.column("system_prompt", sa.Text),
        sa.column("keeps_transcript", sa.Boolean),
    )
    messages = sa.table("messages", sa.column("namespace", sa.String), sa.column("agent_id"))
    talked = sa.exists().where(
        messages.c.namespace == agents.c.namespace, messages.c.agent_id == agents.c.agent_id
    )
    op.execute(
        agents.update()
        .where(sa.or_(agents.c.system_prompt.is_not(None), talked))
        .values(keeps_transcript=True)
    )
