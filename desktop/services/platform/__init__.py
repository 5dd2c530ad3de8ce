"""This computer: where files live, settings, secrets in the keyring, the log, and what is installed."""
