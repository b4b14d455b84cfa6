"""XIDs and other NVML events: the kernel-log scan and the NVML event sources (check.py), their
settings (settings.py). The XID catalog is hardware data (babysitter/hardware/xids.py). Kept
import-free: config.py imports settings.py without NVML."""
