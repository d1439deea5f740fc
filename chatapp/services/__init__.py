"""App services: what the UI and the CLI ask for, in their terms, on top of the engine."""
