"""fedrl algorithms: a batched functional core and SB3-style classes."""
