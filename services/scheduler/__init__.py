"""The scheduler: the one control process (leader), relaying the outbox and moving tasks on."""
