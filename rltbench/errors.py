"""User-facing errors: one clear line and exit code 2, never a traceback."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user (flags, paths, files). The CLI prints the message alone, exit 2."""

    exit_code = 2
