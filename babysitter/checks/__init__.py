"""Node checks: one module per domain defining `Check` classes (see base.py); `all.py` lists
them."""
