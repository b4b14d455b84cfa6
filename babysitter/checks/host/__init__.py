"""Host basics: disks, memory, mounts, slurmd (check.py)."""
