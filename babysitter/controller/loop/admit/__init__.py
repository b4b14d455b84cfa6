"""Admit: the one admission step every automatic change passes, and the one door to Slurm."""
