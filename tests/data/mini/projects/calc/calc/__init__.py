"""A tiny calculator used by the engine's own tests."""
