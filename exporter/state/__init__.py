"""What survives a restart: the SQLite state, result files and their encoding."""
