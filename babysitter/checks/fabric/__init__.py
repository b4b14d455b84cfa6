"""The GPU fabric of NVSwitch systems: NVML's fabric state, status and health per GPU, and the
services that train and span it (nvidia-fabricmanager, nvidia-imex), where the node's hardware
profile says it has them. Kept import-free: config.py imports settings.py without NVML."""
