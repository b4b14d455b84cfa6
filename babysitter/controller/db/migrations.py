"""Apply the Alembic migrations in the top-level sql/ (package babysitter.sql) with
`babysitter db upgrade`; the controller also runs them at start."""

from __future__ import annotations

from importlib.resources import files

from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import Engine

# Package data, so an installed wheel can migrate (Alembic needs a directory on disk: a wheel
# install always unpacks it).
SQL_DIR = files("babysitter.sql")


def alembic_config() -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(SQL_DIR))
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    cfg = alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
