# Data plane targets (issue 3). Included by the top-level Makefile, which defines
# PY (the project python, .venv/bin/python). Everything lives under cluster/ and
# kestrel/cluster/; build output is cached in ~/.cache/kestrel (never in the repo).
CLUSTER_DIR := $(dir $(lastword $(MAKEFILE_LIST)))
PY ?= .venv/bin/python
CLUSTER_CHECK_JOBS ?= 500

.PHONY: cluster-build cluster-up cluster-down cluster-status cluster-check images

cluster-build: ## Build pinned etcd/kubernetes/kwok/kueue/kubelet from the Go module registry (cached)
	$(CLUSTER_DIR)build.sh

images: ## Build the pause and Kestrel container images here (cached by input hash)
	PY=$(PY) images/build.sh

cluster-up: ## Start the local control plane + Kueue + KWOK GPU pool + the real CPU node (idempotent)
	PY=$(PY) $(CLUSTER_DIR)up

cluster-down: ## Stop the CPU node (nothing left behind), Kueue, and delete the local cluster
	PY=$(PY) $(CLUSTER_DIR)down

cluster-status: ## Versions, processes, nodes, queues of the local cluster
	PY=$(PY) $(CLUSTER_DIR)status

cluster-check: ## Bring the cluster up, check quota, run a pod on the real node, measure bare-Kueue admissions/s
	$(PY) bench/cluster_check.py --jobs $(CLUSTER_CHECK_JOBS)
