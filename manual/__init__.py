"""The manual's own tools: the references generated from the code (`http_reference`), and
the checks that keep the pages true to it (`settings_mentioned`). `scripts/docs` runs them."""
