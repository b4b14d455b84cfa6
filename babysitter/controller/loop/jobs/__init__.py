"""Jobs: babysat jobs tracked from Slurm, their requeues and NCCL requeues."""
