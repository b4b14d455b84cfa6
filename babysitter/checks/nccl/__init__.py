"""NCCL: the all_reduce_perf bandwidth test and the job-log scan (check.py)."""
