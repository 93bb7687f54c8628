"""Thin route modules: validate, call `shared/` and `services.api` functions, map to views."""
