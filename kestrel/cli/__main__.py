"""`python -m kestrel.cli`."""

from kestrel.cli import main

main()
