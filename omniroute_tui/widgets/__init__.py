"""The console's widgets. Each one is handed view models (attributes down) and posts messages up."""
