"""The tool's error hierarchy: one base, four kinds.

Every user-facing error is a ``ToolError`` whose message is one line naming the file or
field at fault and how to fix it; CLIs print it as ``<prog>: error: <message>`` and exit 2.
``assert`` is for internal invariants only and never reaches a user.
"""
from __future__ import annotations


class ToolError(Exception):
    """Base of every error a user can cause and fix (bad input, missing data, failed launch)."""

    def __str__(self) -> str:
        # a message built as a core.i18n.Message stays one through str(e): a note that prints the error translates it
        return self.args[0] if len(self.args) == 1 and isinstance(self.args[0], str) else super().__str__()


class ConfigError(ToolError):
    """A matrix/config/CLI value is invalid (names the key and the valid choices)."""


class ParseError(ToolError):
    """A file exists but cannot be read as the expected format (names the file and line)."""


class LaunchError(ToolError):
    """A run or subprocess could not be started (names the command and the cause)."""


class NoDataError(ToolError):
    """The input holds nothing to work on: empty directory, not a campaign, no metrics."""
