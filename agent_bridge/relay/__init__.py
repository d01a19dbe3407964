"""The relay (`agent-bridge mcp`, one per agent session): main.py and its parts, one job each,
standard library only; quick.py, a job's MCP server as a script.

Decisions with no I/O: `keeper` (when to look for, start or wait for the broker), `replay`
(what a joining broker hears first), `requests` (what is in flight, what is resent), `answers`
(the lines the relay writes itself). Their I/O: `host_io` (the host's pipes and signals),
`link` (the broker connection), `pump` (both on one thread, POSIX), `connector` (finding,
starting and joining the broker), `shown` (what was shown, over the ledger), `alone` (serving
while no broker answers), `leaving` (the host leaving).
"""
