"""GPU checks through NVML: presence, memory, NVLink, PCIe, thermals (check.py)."""
