"""NCCL: the all_reduce_perf bandwidth test and the job-log scan (check.py), their settings
(settings.py). Kept import-free: config.py imports settings.py."""
