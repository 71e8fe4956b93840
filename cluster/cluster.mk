# Data plane targets (issue 3). Included by the top-level Makefile, which defines
# PY (the project python, .venv/bin/python). Everything lives under cluster/ and
# kestrel/cluster.py; build output is cached in ~/.cache/kestrel (never in the repo).
CLUSTER_DIR := $(dir $(lastword $(MAKEFILE_LIST)))
PY ?= .venv/bin/python
CLUSTER_CHECK_JOBS ?= 500

.PHONY: cluster-build cluster-up cluster-down cluster-status cluster-check

cluster-build: ## Build pinned etcd/kubernetes/kwok/kueue (+kubelet) from the Go module registry (cached)
	$(CLUSTER_DIR)build.sh

cluster-up: ## Start the local control plane + Kueue + KWOK GPU pool (idempotent)
	PY=$(PY) $(CLUSTER_DIR)up

cluster-down: ## Stop Kueue and delete the local cluster
	PY=$(PY) $(CLUSTER_DIR)down

cluster-status: ## Versions, processes, nodes, queues of the local cluster
	PY=$(PY) $(CLUSTER_DIR)status

cluster-check: ## Bring the cluster up, check quota behaviour, measure bare-Kueue admissions/s
	$(PY) bench/cluster_check.py --jobs $(CLUSTER_CHECK_JOBS)
