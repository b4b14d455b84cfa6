"""NVIDIA DCGM diagnostics (`dcgmi diag`), run by `babysitter validate` where DCGM is installed."""
