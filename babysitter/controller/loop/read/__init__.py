"""Read: the tick's view of the store and of Slurm, taken once at its start."""
