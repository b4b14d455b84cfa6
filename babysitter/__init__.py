"""babysitter: Slurm-integrated GPU cluster health and job babysitter."""

__version__ = "0.2.0"
