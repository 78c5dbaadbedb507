"""The `farm` command line (typer): commands only call into the stages."""
