"""The federation's domain errors: each message is one line for a person (STYLE 7)."""

from __future__ import annotations

import importlib
from types import ModuleType

INSTALL_HINT = "pip install 'agent-bridge[federation]'"


class FederationError(Exception):
    """Something about federation a person can fix or must know; str() is one line."""


class SettingsError(FederationError):
    """A bad value in [federation] of config.toml: names the key, what is allowed, what was given."""


class IdentityError(FederationError):
    """The machine's seed file cannot be used (mode looser than 0600, not a user seed, unreadable)."""


class MissingExtra(FederationError):
    """nats-py or nkeys is not installed."""


class HubError(FederationError):
    """The hub refused or could not do what was asked (a definite answer, not a timeout)."""


class StoreLost(HubError):
    """The hub has no team stream, or no consumer of this machine's, that it had: its JetStream
    store was lost (a power cut, a new disk) or it is still starting. Make sure of the streams
    again (ensure_streams); a fetch makes its consumer again by itself. Nothing that was sent
    was stored by this answer."""


class Unknown(FederationError):
    """A publish whose outcome is unknown (timed out, connection lost before the PubAck): it may be stored
    or not. Retry with the same message id; the hub's duplicate window makes the retry a no-op if the
    first one was stored."""


class NotConnected(FederationError):
    """The transport is closed, or was never connected."""


def require(name: str) -> ModuleType:
    """Import nats-py's or nkeys' module `name`, or raise MissingExtra with the one line to fix it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        top = name.split(".")[0]
        raise MissingExtra(
            f"federation needs the {top!r} package, which is not installed: {INSTALL_HINT}"
        ) from None
