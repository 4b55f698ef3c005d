"""Alembic environment for the ledger (run by lane_plugin.ledger.schema).

lane_plugin.ledger.schema always hands over an open connection (made from the URL the ledger
itself parsed); this environment never reads a URL string, so there is one parser.
"""

from alembic import context

from lane_plugin.ledger.models import metadata

config = context.config


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        raise RuntimeError("run the ledger's migrations through lane_plugin (lane db upgrade), not the alembic CLI")
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


run()
