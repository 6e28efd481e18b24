"""HTTP layer: the Starlette app and routes, request parsing, limits, responses."""
