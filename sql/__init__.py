"""Alembic migrations and the generated PostgreSQL schema (top-level sql/ in the repository,
shipped as package data of babysitter.sql)."""
