"""Expected failures: the CLI prints `error: <message>` on one line and exits with `exit_code`."""


class BabysitterError(Exception):
    exit_code = 1


class ConfigError(BabysitterError):
    exit_code = 2


class UsageError(BabysitterError):
    exit_code = 2
