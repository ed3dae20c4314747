"""The dispatch engine: the worker pool, its claim loops and one dispatcher per protocol."""
