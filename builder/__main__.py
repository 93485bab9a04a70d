"""`python -m builder`: the same entry as the `builder` command."""
from builder.cli import main

main()
