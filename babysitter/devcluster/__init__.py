"""A real local Slurm cluster (munged, slurmctld, N x `slurmd -N`, slurmrestd) for tests, the
demo and trying things out. `DevCluster` is the Python API; `babysitter devcluster` the CLI."""

from babysitter.devcluster.cluster import ClusterInfo, DevCluster

__all__ = ["ClusterInfo", "DevCluster"]
