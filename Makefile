# Kestrel. On a fresh machine `make demo` and `make test` are all a user types:
# both run `make setup` first, which installs what the project needs.
SHELL := /bin/bash
PY := .venv/bin/python
BUF := tools/buf/node_modules/.bin/buf
export PATH := $(CURDIR)/.venv/bin:$(PATH)
include cluster/versions.env

.PHONY: help setup proto api-docs proto-check buf-lint buf-breaking lint test test-unit \
        test-integration test-e2e prom-lint demo bench-meter bench-gateway bench-scale bench-jobs bench-infer bench-gpu bench-autoscale soak chaos chaos-ha up down status grpcurl \
        helm helm-check compose compose-check compose-up compose-down devstack-up devstack-down devstack-status clean sim-autoscale

help: ## This list
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

setup: ## Install everything (Debian packages, .venv, buf); idempotent
	@scripts/setup.sh

proto: setup ## Regenerate the kestrel_sdk.v1 stubs (sdk/python), docs/api.md and the console's TypeScript clients from proto/
	scripts/gen_proto.sh
	$(MAKE) api-docs
	$(MAKE) console-gen

api-docs: setup ## Regenerate docs/api.md from the comments in proto/
	$(PY) scripts/gen_api_docs.py docs/api.md

proto-check: setup ## Fail if the committed stubs are not what proto/ generates
	@tmp=$$(mktemp -d); scripts/gen_proto.sh $$tmp && \
	  diff -r -x __pycache__ $$tmp/kestrel_sdk/v1 sdk/python/kestrel_sdk/v1 >/dev/null || \
	  { echo "sdk/python/kestrel_sdk/v1 is stale: run 'make proto' and commit"; rm -rf $$tmp; exit 1; }; \
	  rm -rf $$tmp; echo "proto-check: generated stubs are fresh"
	@tmp=$$(mktemp); $(PY) scripts/gen_api_docs.py $$tmp && cmp -s $$tmp docs/api.md || \
	  { echo "docs/api.md is stale: run 'make api-docs' and commit"; rm -f $$tmp; exit 1; }; \
	  rm -f $$tmp; echo "proto-check: docs/api.md is fresh"

buf-lint: setup
	cd proto && ../$(BUF) lint

buf-breaking: setup ## Compare proto/ with main (skipped while main has no protos)
	@if git cat-file -e main:proto/buf.yaml 2>/dev/null; then \
	  $(BUF) breaking proto --against '.git#branch=main,subdir=proto' && \
	  echo "buf-breaking: no breaking change against main"; \
	else echo "buf-breaking: main has no protos yet, skipped"; fi

lint: setup proto-check console-check buf-lint buf-breaking prom-lint compose-check ## ruff, mypy, import contracts, buf lint, buf breaking, fresh stubs, alert rules, docker-compose.yml
	$(PY) -m ruff check kestrel kestrel_tools sdk/python services tests bench
	$(PY) -m mypy kestrel kestrel_tools sdk/python/kestrel_sdk services tests bench
	lint-imports  # pyproject [tool.importlinter]: services on the runtime alone, never each other

prom-lint: setup ## promtool: the alert rules are valid and pass their unit tests
	promtool check rules deploy/prometheus/rules/*.yml
	promtool test rules deploy/prometheus/tests/*.yml

test-unit: setup ## Pure logic, no I/O
	$(PY) -m pytest tests/unit -q

test-integration: setup grpcurl ## Against real Postgres, NATS JetStream, Redis (started by the fixtures)
	$(PY) -m pytest tests/integration -q

test-e2e: setup ## Against the real Kubernetes data plane (built and started on demand)
	$(PY) -m pytest tests/e2e -q

.PHONY: fuzz
fuzz: setup ## Every RPC and bus consumer fed hostile input, many examples; prints the fuzz: line
	KESTREL_FUZZ_EXAMPLES=$${KESTREL_FUZZ_EXAMPLES:-300} $(PY) -m pytest tests/integration/test_fuzz.py -q

test: setup lint grpcurl ## Lint, then every test tier (the slowest 15 listed: where the time goes), then the console in chromium
	$(PY) -m pytest tests -q --durations=15
	$(MAKE) test-console

# With --keep the demo leaves the operator console running too: build it first.
demo: setup $(if $(findstring --keep,$(DEMO_ARGS)),console-deps console/.next/BUILD_ID) ## Bring up the stack and run the main scenario, ending with a summary table
	$(PY) -m kestrel_tools.demo $(DEMO_ARGS)

bench-meter: setup ## Ledger ingestion and runway latency vs the bare pipeline of this machine
	$(PY) -m bench.meter $(BENCH_ARGS)

bench-gateway: setup ## Submit rate and latency vs the gRPC ceiling of this machine
	$(PY) -m bench.gateway $(BENCH_ARGS)

bench-scale: setup ## Kestrel's CPU per job and decision p99 as the queue grows (250, 1,000, 4,000 waiting)
	$(PY) -m bench.scale $(BENCH_ARGS)

bench-infer: setup ## Infer end to end (gateway -> Redis -> a worker replica) vs raw onnxruntime here
	$(PY) -m bench.infer $(BENCH_ARGS)

bench-gpu: setup ## The worker's model on a real GPU (torch, CUDA) vs the same machine's CPU; exits 2 without one
	$(PY) -m bench.gpu prepare .run/bench-gpu
	$(PY) -m bench.gpu run .run/bench-gpu

bench-autoscale: setup ## The autoscaler on the real cluster: scale up/down, cold start, exhaustion
	$(PY) -m bench.autoscale $(BENCH_ARGS)

soak: setup ## Mixed tenant load at half of saturation for SOAK_MINUTES (30): RSS, fds, p99 per minute
	$(PY) -m bench.soak --minutes $${SOAK_MINUTES:-30} $(BENCH_ARGS)

bench-jobs: setup ## The whole plane vs bare Kueue on the real cluster; the gate; the ledger vs Kubernetes
	$(PY) -m bench.jobs $(BENCH_ARGS)

chaos: setup ## Every component faulted in turn under load (kill -9, restarts): nothing lost or doubled
	$(PY) -m bench.chaos $(BENCH_ARGS)

chaos-ha: setup ## Two replicas of every service, three NATS nodes, a Postgres pair: one of each killed in turn under load
	$(PY) -m bench.chaos --ha $(BENCH_ARGS)

sim-autoscale: setup ## Autoscaler scenarios replayed through its core (simulated): reports/sim-autoscale/
	$(PY) -m bench.autoscale_sim --out reports/sim-autoscale $(SIM_ARGS)

up: setup grpcurl ## Run the plane for people: devstack + meter, gateway, admission (+ placer); HA=1: 3 NATS nodes, a Postgres pair
	$(if $(HA),KESTREL_NATS_NODES=3 KESTREL_PG_NODES=2 ,)$(PY) -m kestrel_tools.plane up

down: ## Stop what `make up` started
	$(PY) -m kestrel_tools.plane down

status: ## Is the plane serving?
	$(PY) -m kestrel_tools.plane status

grpcurl: setup ## Build the pinned grpcurl (cached) into .venv/bin
	@cluster/build.sh grpcurl >/dev/null && \
	  ln -sf $(HOME)/.cache/kestrel/bin/grpcurl-$(GRPCURL_VERSION) .venv/bin/grpcurl

helm: setup ## Build the pinned helm (cached) into .venv/bin
	@cluster/build.sh helm >/dev/null && \
	  ln -sf $(HOME)/.cache/kestrel/bin/helm-$(HELM_VERSION) .venv/bin/helm

helm-check: setup helm ## The chart: lint, template, server-side dry run, install on the real node, helm test, upgrade, rollback
	$(PY) -m kestrel_tools.helmcheck $(HELM_CHECK_ARGS)

compose: setup ## Build Compose v2 (cached) and install it as the docker CLI plugin
	$(PY) -c "from kestrel_tools import dockerd; dockerd.compose_plugin()"

compose-check: compose ## docker-compose.yml is valid (docker compose config)
	docker compose config --quiet && echo "compose: docker-compose.yml valid"

compose-up: setup compose ## The whole stack in containers: engine, image, local cluster, then up --wait
	$(PY) -m kestrel_tools.dockerd images
	PY=$(PY) cluster/up
	docker compose up -d --wait
	docker compose ps

compose-down: ## Stop it (the stores' volumes stay; `docker compose down -v` drops them)
	docker compose down

devstack-up: setup ## Start Postgres, NATS, Redis on loopback (.run/devstack)
	$(PY) -m kestrel_tools.devstack up

devstack-down: ## Stop them
	$(PY) -m kestrel_tools.devstack down

devstack-status:
	$(PY) -m kestrel_tools.devstack status

clean: devstack-down
	rm -rf .run

# --- operator console (console/: Next.js; README "Operator console") -------------
CONSOLE_PORT ?= $(or $(KESTREL_CONSOLE_PORT),3000)
CONSOLE_SRC := $(shell find console/src console/next.config.ts console/tsconfig.json -type f 2>/dev/null)
CONSOLE_NPM := PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm --prefix console

.PHONY: console console-deps console-gen console-check test-console

console-deps: ## npm ci for console/, skipped while package-lock.json's hash is unchanged
	@want=$$(sha256sum console/package-lock.json | cut -d' ' -f1); \
	  if [ "$$(cat console/node_modules/.lock-sha256 2>/dev/null)" != "$$want" ]; then \
	    echo "console-deps: npm ci (package-lock.json changed or first run)"; \
	    $(CONSOLE_NPM) ci --no-audit --no-fund && echo $$want > console/node_modules/.lock-sha256; \
	  fi

console-gen: setup console-deps ## Regenerate console/src/gen (TypeScript) from proto/ with buf + protoc-gen-es
	cd console && ../$(BUF) generate ../proto --template buf.gen.yaml

console-check: setup console-deps ## Fail if console/src/gen is not what proto/ generates
	@tmp=$$(mktemp -d); cp console/buf.gen.yaml $$tmp/; \
	  sed -i "s|local: node_modules|local: $(CURDIR)/console/node_modules|; s|out: src/gen|out: $$tmp/gen|" $$tmp/buf.gen.yaml; \
	  $(BUF) generate proto --template $$tmp/buf.gen.yaml && diff -r $$tmp/gen console/src/gen >/dev/null || \
	  { echo "console/src/gen is stale: run 'make console-gen' and commit"; rm -rf $$tmp; exit 1; }; \
	  rm -rf $$tmp; echo "console-check: generated TypeScript clients are fresh"

console/.next/BUILD_ID: $(CONSOLE_SRC) console/package-lock.json
	cd console && node_modules/.bin/next build

console: setup console-deps console-check console/.next/BUILD_ID ## Run the operator console on 127.0.0.1:$KESTREL_CONSOLE_PORT (3000) against `make up`'s plane
	@echo "console: http://127.0.0.1:$(CONSOLE_PORT)  (gateway $${KESTREL_GATEWAY_ADDR:-127.0.0.1:50051}, meter $${KESTREL_METER_ADDR:-127.0.0.1:50053}, admission $${KESTREL_ADMISSION_ADDR:-127.0.0.1:50052}; operator token from $$(if [ -n "$$KESTREL_OPERATOR_TOKEN" ]; then echo '$$KESTREL_OPERATOR_TOKEN'; else echo "$${KESTREL_OPERATOR_TOKEN_FILE:-.run/plane/operator-token}"; fi))"
	cd console && exec node_modules/.bin/next start -H 127.0.0.1 -p $(CONSOLE_PORT)

test-console: setup console-deps console-check console/.next/BUILD_ID ## Playwright + Debian's chromium against the console on a throwaway plane
	@command -v chromium >/dev/null || { echo "test-console: installing Debian's chromium"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	cd console && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 node_modules/.bin/playwright test

-include cluster/cluster.mk
