# Shortcuts for the scripts (the scripts are the real thing; see scripts/*).
.PHONY: up down test ci

up: ; scripts/up
down: ; scripts/down
test: ; scripts/test $(ARGS)
ci: ; CI=true bash .ci/run
