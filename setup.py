"""Only what pyproject.toml cannot say: the top-level sql/ and slurm-plugins/ folders are the
packages babysitter.sql and babysitter.slurm_plugins (package-dir works for the wheel and the
editable install; code finds them with importlib.resources)."""

from setuptools import find_packages, setup

MAPPED = {
    "babysitter.sql": "sql",
    "babysitter.sql.versions": "sql/versions",
    "babysitter.slurm_plugins": "slurm-plugins",
}

setup(
    packages=[*find_packages(include=["babysitter", "babysitter.*"]), *MAPPED],
    package_dir=MAPPED,
)
