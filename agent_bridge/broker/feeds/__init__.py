"""The tasks that follow the store's commit feed: the wake waiters (waiters.py) and the post box
(postbox.py); the owner's alerts (broker/alerts) follow it the same way."""
