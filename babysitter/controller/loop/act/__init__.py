"""Act: the executor that carries out admitted actions, with pending/retry."""
