"""Vigil's four services: api, scheduler, worker and supervisor."""
