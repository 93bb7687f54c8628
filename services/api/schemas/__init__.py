"""The api's request bodies and answers, one module per group of routes (`routes/`): jobs,
tasks, events, outputs, bulk, admin, hosts, health; what they share is in `common`."""
