"""The relay's parts (agent_bridge.relay), driven directly: no broker, no threads, time an argument."""
