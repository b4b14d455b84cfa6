"""The decision and action pipeline: facts gathered per tick, the pure policy, remediation
and its executor, jobs, validation, self-healing, fabric and blast radius, alerts, metrics.
Imports db/, never api/ (pyproject.toml [tool.importlinter])."""
