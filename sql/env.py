"""Alembic environment for babysitter (run through `babysitter db upgrade`)."""

from alembic import context

from babysitter.controller.db.models import metadata

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through `babysitter db upgrade`")

context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
