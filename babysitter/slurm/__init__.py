"""Slurm behind one narrow client (see client.py); backends in cli.py, rest.py, pyslurm.py."""
