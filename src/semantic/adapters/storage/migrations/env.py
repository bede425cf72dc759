"""Alembic's environment for semantic's metadata schema.

Alembic runs this file as a script (it is not a module of the package, and nothing imports
it): ``schema_migrations.upgrade`` hands it the metadata store's own connection, already in
a transaction, which the store commits once the whole upgrade has run.
"""

from __future__ import annotations

from alembic import context

from semantic.adapters.storage.schema import metadata


def run_migrations() -> None:
    connection = context.config.attributes.get("connection")
    if connection is None:
        raise RuntimeError(
            "semantic's migrations run when the server opens its database "
            "(schema_migrations.upgrade), on the connection it hands them"
        )
    # Our transaction holds all the DDL (the store begins and commits it), on SQLite too.
    context.configure(connection=connection, target_metadata=metadata, transactional_ddl=True)
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
