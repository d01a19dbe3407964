"""The dashboard (SPEC §6): a Quart-Trio app on Hypercorn on loopback, served by the broker or, with
no broker, by `agent-bridge dashboard` itself, read-only."""
