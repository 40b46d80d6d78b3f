"""Safety policy packs: checks on a request's input and on its generated output."""
