"""The domain: Vigil's vocabulary and its pure decisions (states and their transition tables,
policies, actions, outcomes, prerequisites, the failure analyser). No I/O."""
