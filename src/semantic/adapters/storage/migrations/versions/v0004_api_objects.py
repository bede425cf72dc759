"""The Responses API's responses, conversations and their items, as JSON documents.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_objects",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("namespace", sa.String, nullable=False),
        sa.Column("kind", sa.String, nullable=False),
        sa.Column("object_id", sa.String, nullable=False),
        sa.Column("parent_id", sa.String, nullable=False, server_default=""),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index(
        "api_objects_id", "api_objects", ["namespace", "kind", "object_id"], unique=True
    )
    op.create_index("api_objects_parent", "api_objects", ["namespace", "kind", "parent_id", "seq"])
