"""`courier serve`: queue-ti's HTTP API over Courier's SQL API, on aiohttp. Every request is
authenticated by a token and runs as the database role of what it does."""
