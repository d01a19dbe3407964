"""Federation across machines over NATS JetStream (SPEC §10): the wire side.

Bytes in, bytes out: these modules carry opaque bodies between machines and know nothing of
messages, receipts or decisions beyond their subjects. What to publish, when to retry and what a
receipt means is the state machine's (agent_bridge.core); the broker feeds one with the other.

Light on import: nothing here loads nats-py or nkeys until a function needs them, so the package
imports without the `federation` extra and says what to install when it is used (errors.require).
Hooks and the relay never import it (import-linter's forbidden contract).

  errors     the domain errors, and the one line for a missing extra
  subjects   the subject, stream and consumer names (pure functions)
  settings   the [federation] table of config.toml
  identity   the machine's NKEY seed and public key
  hub        the nats-server configuration a hub runs
  loop       an asyncio loop on its own thread, owned by a Trio task
  transport  the nats-py connection on that loop, and its Trio-facing wrapper
  commands   `agent-bridge machine` and `agent-bridge federation hub-config`
  checks     what doctor can say without the network (settings, seed, extra)
"""
