"""Node checks: one module per domain, each registering `Check` classes (see base.py)."""
