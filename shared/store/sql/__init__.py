"""Numbered SQL migrations, applied in order by `shared.store.migrate`."""
