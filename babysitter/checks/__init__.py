"""Node checks: one folder per domain (gpu/, xid/, host/, infiniband/, nccl/, sdc/) holding its
`Check` classes (check.py, see base.py), its settings and thresholds (settings.py, which
config.py assembles) and its tier table (tiers.py); `all.py` lists the checks. Import-free:
config.py imports the settings modules through it."""
