"""Model-building helpers shared by backends, engines and tests (torch imported lazily)."""
