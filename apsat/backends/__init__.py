"""apsat.backends."""
