"""Courier's SQL layer: migrations, named queries, one connection layer and typed APIs."""
