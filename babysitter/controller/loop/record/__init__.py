"""Record: what the tick leaves for its readers: verdicts, metrics, alerts."""
