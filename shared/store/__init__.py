"""The store: PostgreSQL. The pool and the migrations, and one home per table for its writes
(`<table>_repo`, the outbox, the event history), each change a compare-and-set."""
