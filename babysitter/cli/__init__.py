"""The `babysitter` command (click). main.py is the root; each group lives in its own module."""
