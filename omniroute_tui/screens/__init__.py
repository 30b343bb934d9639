"""Modal screens: confirmation, filter, help. While one is open the feed skips its ticks."""
