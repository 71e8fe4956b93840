"""Generated from proto/kestrel/v1 by `make proto`; do not edit."""
