"""Kestrel: runway-aware GPU compute control plane."""
