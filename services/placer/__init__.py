"""The placer: the only writer to Kubernetes for Kestrel work."""
