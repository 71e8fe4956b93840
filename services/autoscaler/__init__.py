"""The autoscaler: replica decisions for endpoints.

`domain.decide` is the whole decision, a pure function of one endpoint's observed
load, its policy and its tenant's budget, with the clock passed in: it grows an
endpoint with load while the budget pays for the target over the horizon, stops
growing when the projected cost no longer fits, shrinks it as runway shortens and
takes it to zero when the budget is gone. bench/autoscale_sim.py replays scenarios through
that same function on a virtual clock (`make sim-autoscale`); everything it reports is
simulated.
"""
