"""Model specs: embedded tiny models, hub ids, local folders and single checkpoint files."""
