"""apsat.rules."""
