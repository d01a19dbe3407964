"""bridge.db: schema and migrations, the broker's writer, and the read-only read path.

Import the parts directly (`agent_bridge.store.reader`, `.writer`, `.queries`, `.schema`, …):
the hooks need the read path without the writer. The writer (`writer.Store`) is composed of
one module per concern (`peers`, `messages`, `decisions`, `forgetting`, on `base`), with
`opening` (version check, backups), `tap` (the delivery tap) and `ids` (time and row ids,
which the daemon imports too) beside them.
"""
