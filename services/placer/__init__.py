"""The placer: the only writer to Kubernetes for Kestrel work.

Per tenant a Namespace `kestrel-<tenant>`, a LocalQueue `gpu` and a ClusterQueue
`kestrel-<tenant>` in cohort `kestrel-gpu`; a suspended batch/v1 Job per admitted
job, on the flavor its runway allows; WorkloadEvents from Kueue's timestamps.

Environment (all optional):

- KESTREL_NATS_URL, KESTREL_POSTGRES_DSN     where the bus and the database are
- KESTREL_KUBECONFIG                          default: kestrel_tools.cluster's kubeconfig
- KESTREL_BIND_HOST (127.0.0.1), KESTREL_PLACER_PORT (50054)
- KESTREL_PLACER_METRICS_PORT (9154; 0 disables /metrics)
- KESTREL_RUNWAY_CHECK (kestrel-runway; empty: ClusterQueues without an AdmissionCheck)
- KESTREL_PLACER_SHORT_BP (2500: runway is short under 25% of the credits left)
- KESTREL_PLACER_FLAVORS (gpu-h100,gpu-a10: the ResourceFlavors a tenant has quota in)
- KESTREL_PLACER_REFRESH_S (10: re-read prices and tenant quotas)
- KESTREL_PLACER_ACK_WAIT_S (30: an admitted job not placed by then is delivered again;
  a restarted placer takes over its predecessor's in-flight jobs at once regardless)
- KESTREL_LOG_LEVEL (INFO)
"""
