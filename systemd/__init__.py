"""The systemd units, the HealthCheckProgram wrapper and the example configuration; top-level
systemd/ in the repository, shipped as babysitter.systemd (docs/deploy.md installs them from
the wheel)."""
