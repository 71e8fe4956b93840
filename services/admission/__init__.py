"""Admission: whether work runs. Reserves budget, holds or rejects jobs."""
