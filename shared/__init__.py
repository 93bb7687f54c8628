"""Vigil's shared package: messages, states, topology, database access and configuration."""
