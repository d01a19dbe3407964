"""The wire between the processes and the broker: the protocol and its frames, the listeners, the
Trio client, the blocking client the hooks and the command line use, and the owner's calls."""
