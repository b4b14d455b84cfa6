"""Host basics: disks, memory, mounts, slurmd (check.py) and their settings (settings.py).
Kept import-free: config.py imports settings.py."""
