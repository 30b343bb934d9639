"""omniroute-tui: the operator console and the command line."""
