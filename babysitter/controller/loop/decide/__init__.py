"""Decide: pure functions from the tick's view to proposed actions. No I/O and no writes: an
import-linter contract (pyproject.toml) holds every module here to it."""
