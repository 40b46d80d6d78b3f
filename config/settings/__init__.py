"""Settings per environment: base, dev, test, prod. All read environment variables."""
