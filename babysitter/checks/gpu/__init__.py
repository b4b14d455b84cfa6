"""GPU checks through NVML: presence, memory, NVLink, PCIe, thermals. Everything about them lives
in this folder: the checks (check.py), their settings and thresholds (settings.py) and their tier
table (tiers.py). Kept import-free: config.py imports settings.py without NVML."""
