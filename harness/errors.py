"""Errors the harness reports to the user as one clear message (no traceback)."""


class HarnessError(Exception):
    """Bad input: config, record, file or command-line value. Message names what is wrong."""


class ConfigError(HarnessError):
    """A configuration value is invalid; raised before anything launches."""
