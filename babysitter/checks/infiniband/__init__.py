"""InfiniBand ports from sysfs (check.py)."""
