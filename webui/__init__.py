"""Shared web pieces of both consoles: sessions/login, CSRF, safe redirects, error handlers,
base templates and shared static assets."""
