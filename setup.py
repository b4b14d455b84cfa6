"""Only what pyproject.toml cannot say: the top-level sql/, slurm-plugins/ and systemd/ folders are
the packages babysitter.sql, babysitter.slurm_plugins and babysitter.systemd (package-dir works
for the wheel and the editable install; code and docs/deploy.md find them with
importlib.resources)."""

from setuptools import find_packages, setup

MAPPED = {
    "babysitter.sql": "sql",
    "babysitter.sql.versions": "sql/versions",
    "babysitter.slurm_plugins": "slurm-plugins",
    "babysitter.systemd": "systemd",
}

setup(
    packages=[*find_packages(include=["babysitter", "babysitter.*"]), *MAPPED],
    package_dir=MAPPED,
)
