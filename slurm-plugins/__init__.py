"""Sources of the Slurm plugins (babysit SPANK plugin, job_submit.lua); top-level slurm-plugins/
in the repository, shipped as babysitter.slurm_plugins."""
