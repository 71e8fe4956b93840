"""Kestrel's local-development and operations tooling: the local cluster (`cluster`),
the loopback stores (`devstack`), the whole plane (`plane`, `make up`), the demo,
the Helm and docker-compose checks (`helmcheck`, `containers`, `dockerd`), store
provisioning, `kestrel tap`, the smoke check and the local Prometheus.

No service and no module of the runtime library (`kestrel`) imports it (`make lint`,
pyproject's import contracts): what a service needs from here arrives as a `KESTREL_*`
setting (`kestrel.config`).
"""
