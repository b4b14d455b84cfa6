"""XIDs and other NVML events: the kernel-log scan and the NVML event sources (check.py)."""
