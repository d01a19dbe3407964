"""What several processes share, standard library only: the domain rules and the home folder.

domain.py (topics, scopes, hops), rows.py (typed rows), tools.py (the MCP tool table),
paths.py (the home folder and its files), config.py (config.toml), jsonlimit.py (bounded JSON),
marks.py (busy/idle marks), display.py (text for a terminal), procinfo.py (a process's identity),
ledger.py (acknowledgements a relay or a hook could not hand over yet). The hooks and the relay
import these, so none of them may import trio, mcp, quart or hypercorn.
"""
