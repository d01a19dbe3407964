"""The broker (`agent-bridge up`): one Trio program whose root nursery (root.py) supervises the store,
the listener, one task per session, the jobs, the commit feed's followers and the dashboard.

control.py starts and stops it; routing.py, connection.py, serving.py and delivery.py serve a
connection; mcp/ is a relay's session's MCP side; ops/ the op handlers by domain; jobs/ the jobs'
supervisor; feeds/ the wake waiters and the post box; alerts/ the owner's desktop alerts; state.py
the broker's state and dispatch; sessions/ who is who; storage.py the store's worker thread.
"""
