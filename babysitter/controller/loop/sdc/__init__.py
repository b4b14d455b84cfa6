"""The periodic SDC test, on by default, without ever touching a job: which nodes are due
(due.py), the schedule table (store.py) and the scheduler (schedule.py)."""
