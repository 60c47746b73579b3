"""The HTTP surface: app, routes, handlers, fan-out, exposition, middleware."""
