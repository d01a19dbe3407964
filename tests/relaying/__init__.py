"""The relay's parts (agent_bridge.relaying), driven directly: no broker, no threads, time an argument."""
