"""Who is who: a session (session.py), the connected sessions (registry.py), and the identity
rules that resume, pair and rank them (identity.py)."""
