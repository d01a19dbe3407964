"""The broker's op handlers by domain, and the table that loads and checks them (handlers.py)."""
