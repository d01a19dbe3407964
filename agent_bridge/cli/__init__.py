"""The owner's command line: `agent-bridge` (main.py parses it; each command loads what it needs).

main.py (the parser and dispatch, imports only argparse), commands.py (the owner's actions:
decide, send, retract, answer, forget, sessions, questions, jobs), reads.py (decisions and
search, read-only), install.py (host registration), doctor.py (checks), demo.py (a guided run).
"""
