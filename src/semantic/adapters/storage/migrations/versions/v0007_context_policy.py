"""An agent's context policy: what a conversation past its trigger drops or clears.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("agents", sa.Column("context_policy", sa.Text))
