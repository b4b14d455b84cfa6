"""The node policy, pure: each node's facts to a verdict and decisions (rules, verdict,
the drain guard), and the cluster-wide decide()."""
