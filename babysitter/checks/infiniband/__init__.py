"""InfiniBand ports from sysfs (check.py), their settings (settings.py) and tier table
(tiers.py). Kept import-free: config.py imports settings.py."""
