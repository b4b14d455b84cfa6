"""Heal: the steps of a remediation episode (ladder rungs, validation, take-over, lemons, RMA
evidence) and the periodic SDC schedule."""
