"""Subcommands of the `omnidraft` CLI, discovered by omnidraft.cli (one module each)."""
