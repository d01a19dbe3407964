"""The hooks (`agent-bridge hook …`): short commands the agent hosts run at their events (SPEC §3
"Reach", §4.5), standard library only: they read bridge.db directly and talk to the broker when it
is up."""
