"""The owner's desktop alerts: a task fed by the store's commits (task.py) over desktop-notifier
on a worker thread (desktop.py)."""
