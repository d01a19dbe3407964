"""bridge.db: schema and migrations, the broker's writer, and the read-only read path.

Import the parts directly (`agent_bridge.store.reader`, `.writer`, `.queries`, `.schema`):
the hooks need the read path without the writer.
"""
