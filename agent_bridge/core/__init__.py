"""State machines with no I/O (STYLE 13): what a session was shown and acknowledged, a job's life,
what the owner is alerted of. Time is an argument; the processes feed them events."""
