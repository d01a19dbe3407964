"""agent-bridge: a local broker for AI coding-agent sessions (SPEC.md)."""

__version__ = "0.1.0"
