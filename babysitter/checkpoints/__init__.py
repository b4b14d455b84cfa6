"""Find the newest COMPLETE checkpoint under a directory, for the common training frameworks,
and explain the choice. Stdlib only (the job-side helper imports it inside training scripts)."""

from babysitter.checkpoints.discover import Candidate, Choice, find_latest_complete
from babysitter.checkpoints.resume import read_resume_json, write_resume_json

__all__ = ["Candidate", "Choice", "find_latest_complete", "read_resume_json", "write_resume_json"]
