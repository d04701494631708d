"""User-side plug-ins that live outside ``src/`` (the method plug-in test registers them)."""
