"""Management commands of the embedded app."""
