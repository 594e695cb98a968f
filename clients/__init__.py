"""One NumPyClient per algorithm, on the shared `BaseClient`."""
