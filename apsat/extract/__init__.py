"""apsat.extract."""
