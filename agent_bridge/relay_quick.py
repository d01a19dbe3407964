"""Where a job's MCP server script was before the relay had a folder of its own: a job whose host
was started by an earlier version names `python -I -S .../agent_bridge/relay_quick.py mcp …` in
its MCP configuration and may start that server again (a reload, a broker restart). It runs
`relay/quick.py`, as that script, in this process: nothing more is imported first.
"""

import sys

if __name__ == "__main__":
    _script = __file__.rsplit("/", 1)[0] + "/relay/quick.py"
    sys.path[0] = _script.rsplit("/", 1)[0]  # the folder of the script run, as Python sets it
    with open(_script, "rb") as _f:
        _code = compile(_f.read(), _script, "exec")
    exec(_code, {"__name__": "__main__", "__file__": _script, "__builtins__": __builtins__})
