"""Kestrel services, one subpackage each."""
