"""The broker's MCP side: one relay's session served over the MCP SDK (host.py and its parts),
the fast path that answers the common requests without the SDK (fast.py), every contact with
the SDK beyond its public surface (sdk.py), and the host's lines checked before the SDK reads them
(stdin.py)."""
