"""`python -m kestrel_sdk.cli`."""

from kestrel_sdk.cli import main

main()
