"""Restaurant reservations: @tool functions over SQLite, the caller's number from the call context."""
