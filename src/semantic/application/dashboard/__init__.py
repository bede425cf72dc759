"""What the dashboard shows: recent turns by agent and minute, and read models of the books."""
