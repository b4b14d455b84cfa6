"""Persistence: the SQLAlchemy models, the store, migrations, the audit log, the tick's
batched reads and writes, retention. Imports neither loop/ nor api/ (pyproject.toml
[tool.importlinter])."""
