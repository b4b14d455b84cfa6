"""Pick the Slurm backend the config names."""

from __future__ import annotations

from babysitter.config import Config
from babysitter.slurm.client import SlurmClient, SlurmError


def make_client(cfg: Config) -> SlurmClient:
    s = cfg.slurm
    if s.backend == "cli":
        from babysitter.slurm.cli import CliSlurmClient

        return CliSlurmClient(s.reason_prefix, s.slurm_conf, s.bin_dir, s.timeout_s)
    if s.backend == "rest":
        from babysitter.slurm.rest import RestSlurmClient, read_jwt

        if not s.slurmrestd_url:
            raise SlurmError("slurm.backend = 'rest' needs slurm.slurmrestd_url")
        return RestSlurmClient(
            s.slurmrestd_url,
            s.reason_prefix,
            jwt_token=read_jwt(s.jwt_token_file),
            slurm_conf=s.slurm_conf,
            bin_dir=s.bin_dir,
            timeout_s=s.timeout_s,
        )
    from babysitter.slurm.pyslurm import PyslurmSlurmClient

    return PyslurmSlurmClient(s.reason_prefix, s.slurm_conf, s.bin_dir, s.timeout_s)
