"""`python -m flashtune` runs the CLI."""
from flashtune.cli import main

main()
