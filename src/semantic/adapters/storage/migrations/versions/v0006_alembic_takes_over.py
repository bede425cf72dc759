"""Alembic keeps the schema from here on; releases from before it refuse this database.

Those releases read ``schema_version`` and refuse a database newer than they know: version
6 tells them so, rather than letting them try to create tables that exist. Only SQLite
databases ever had such a release.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

BEFORE_ALEMBIC_REFUSES = 6


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    if not sa.inspect(bind).has_table("schema_version"):
        op.create_table("schema_version", sa.Column("version", sa.Integer, nullable=False))
    version = sa.table("schema_version", sa.column("version", sa.Integer))
    op.execute(version.insert().values(version=BEFORE_ALEMBIC_REFUSES))
