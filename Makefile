# Every target that needs PostgreSQL gets one the way the test harness does:
# TEST_DATABASE_URL / DATABASE_URL, else local binaries, else Docker; and if
# none is there, scripts/ensure-postgres installs the binaries with apt-get.

GO ?= go
# The library's module and those of the OpenTelemetry adapter, the apvet
# analyzer, the console, the operator CLI and the examples (go.work joins
# them, so one go command covers them all; ./... stops at a nested module).
MODULES := . apotel apui apvet cmd/atomicphase examples
PKGS := ./... ./apotel/... ./apui/... ./apvet/... ./cmd/atomicphase/... ./examples/...

.PHONY: help
help: ## List the targets
	@grep -E '^[a-zA-Z/_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

.PHONY: demo
demo: postgres ## Run the Rocket Rides demo: forty rides booked under crashes and kills, one finished by the sweep, receipts counted
	$(GO) run ./examples/rocketrides/demo

.PHONY: rocketrides
rocketrides: postgres ## Serve the Rocket Rides example on 127.0.0.1:8080
	$(GO) run ./examples/rocketrides

.PHONY: quickstart
quickstart: postgres ## Run the quickstart example end to end
	$(GO) run ./examples/quickstart

.PHONY: cli
cli: ## Build the operator CLI into bin/atomicphase
	$(GO) build -o bin/atomicphase ./cmd/atomicphase

# pgx's query exec modes besides its default (cache_statement); the core
# suite runs once in each (atomicphasetest reads ATOMICPHASE_TEST_EXEC_MODE).
EXEC_MODES := cache_describe describe_exec exec simple_protocol

# The plain-PostgreSQL targets run without the Citus mode's variable, which
# would send every package's tests to Citus (see test/citus).
PLAIN := env -u ATOMICPHASE_TEST_CITUS_URL

# make test is the README's test command: the whole suite in pgx's default
# exec mode, but for the tests that sweep every fault point over many runs
# or drive clients under faults for long, which skip themselves under
# -short (scripts/slow-tests finds them): a few minutes on 2 cores.
# make test-all runs everything, as CI does.
.PHONY: test
test: postgres chromium ## Run the whole test suite but its longest fault sweeps (make test-all runs everything)
	$(PLAIN) $(GO) test -short -count=1 $(PKGS)

.PHONY: test/slow
test/slow: postgres ## Run the tests make test leaves out (scripts/slow-tests lists them)
	@list=$$(scripts/slow-tests) || exit 1; echo "$$list" | while read -r dir re; do \
	  echo "$(GO) test -count=1 -run '$$re' ./$$dir"; \
	  $(PLAIN) $(GO) test -count=1 -run "$$re" ./$$dir || exit 1; \
	done

.PHONY: test-all
test-all: ## Run everything CI runs: make test, the slow tests, every exec mode, PgBouncer, the race detector, PostgreSQL 14 and 18, the previous release, the docs' commands, and Citus if set up
	@$(MAKE) --no-print-directory test
	@$(MAKE) --no-print-directory test/slow
	@$(MAKE) --no-print-directory test/execmodes
	@$(MAKE) --no-print-directory test/rocketrides-pgbouncer
	@$(MAKE) --no-print-directory test/race
	@$(MAKE) --no-print-directory test/versions
	@$(MAKE) --no-print-directory test/previous
	@$(MAKE) --no-print-directory docs-check
	@$(MAKE) --no-print-directory test/citus

# The Citus mode (docs/scale.md): the core suite, the fault-injection
# suites (faultinject, the explorer's) and the examples' tests, each test
# on a database of its own distributed across the Citus coordinator in
# ATOMICPHASE_TEST_CITUS_URL and its workers (scripts/citus-cluster starts a
# local one). Without the variable it prints one line and does nothing.
CITUS_PKGS := . ./faultinject/... ./atomicphasetest/... ./examples/...

.PHONY: test/citus
test/citus: ## Run the core, fault-injection and examples' suites on Citus (ATOMICPHASE_TEST_CITUS_URL; docs/scale.md)
	@if [ -z "$$ATOMICPHASE_TEST_CITUS_URL" ]; then \
	  echo "test/citus: skipped: ATOMICPHASE_TEST_CITUS_URL is not set (scripts/citus-cluster start prints it; see docs/scale.md)"; \
	else \
	  echo "ATOMICPHASE_TEST_CITUS_URL=$$ATOMICPHASE_TEST_CITUS_URL $(GO) test -count=1 -timeout 60m $(CITUS_PKGS)"; \
	  $(GO) test -count=1 -timeout 60m $(CITUS_PKGS); \
	fi

.PHONY: test/execmodes
test/execmodes: postgres ## Run the core suite once per non-default pgx query exec mode
	@for mode in $(EXEC_MODES); do \
	  echo "ATOMICPHASE_TEST_EXEC_MODE=$$mode $(GO) test -count=1 ."; \
	  ATOMICPHASE_TEST_EXEC_MODE=$$mode $(PLAIN) $(GO) test -count=1 . || exit 1; \
	done

# The previous release's core suite, its code from git history, against a
# database this version migrated: an upgrade needs no stop
# (internal/upgradetest, docs/operations.md "Upgrades").
.PHONY: test/previous
test/previous: postgres ## Run the previous release's core suite on this version's schema, and the previous release beside this one
	ATOMICPHASE_TEST_PREVIOUS_RELEASE=1 $(PLAIN) $(GO) test -count=1 -timeout 20m ./internal/upgradetest

# The PgBouncer exec modes: those that work through transaction pooling.
BOUNCER_MODES ?= exec

.PHONY: test/rocketrides-pgbouncer
test/rocketrides-pgbouncer: postgres ## Run Rocket Rides' end-to-end suite through a real PgBouncer (transaction pooling) in each of BOUNCER_MODES
	@for mode in $(BOUNCER_MODES); do \
	  echo "ROCKETRIDES_E2E_PGBOUNCER=1 ATOMICPHASE_TEST_EXEC_MODE=$$mode $(GO) test -count=1 ./examples/rocketrides/"; \
	  ROCKETRIDES_E2E_PGBOUNCER=1 ATOMICPHASE_TEST_EXEC_MODE=$$mode $(PLAIN) $(GO) test -count=1 ./examples/rocketrides/ || exit 1; \
	done

# The oldest and newest supported PostgreSQL major versions; any of 14 to 18
# can be named: make test/versions PG_VERSIONS="15 16 17".
PG_VERSIONS := 14 18

.PHONY: test/versions
test/versions: ## Run the core suite on PostgreSQL 14 and 18 (server binaries from npm)
	@for v in $(PG_VERSIONS); do \
	  bin=$$(./scripts/postgres-version $$v) || exit 1; \
	  echo "$$("$$bin/postgres" --version): ATOMICPHASE_TEST_PG_BIN=$$bin $(GO) test -count=1 ."; \
	  env -u TEST_DATABASE_URL -u DATABASE_URL -u ATOMICPHASE_TEST_CITUS_URL ATOMICPHASE_TEST_PG_BIN="$$bin" $(GO) test -count=1 . || exit 1; \
	done

.PHONY: test/race
test/race: postgres chromium ## Run the whole test suite with the race detector
	$(PLAIN) $(GO) test -race -count=1 $(PKGS)

# docs/production.md's commands, each run or checked by a test.
.PHONY: docs-check
docs-check: postgres ## Run the commands docs/production.md gives
	$(PLAIN) $(GO) test -count=1 -run '^TestProductionGuide' ./cmd/atomicphase/

# make release VERSION=x.y.z: refuses a dirty tree or a failing make test,
# moves [Unreleased] under the version, requires it in every module, commits
# and tags (scripts/release).
.PHONY: release
release: ## Cut a release: make release VERSION=x.y.z
	@scripts/release "$(VERSION)"

.PHONY: lint
lint: ## Check formatting, go vet, a tidy go.mod in every module, and apvet over the examples
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	@for m in $(MODULES); do echo "(cd $$m && $(GO) mod tidy -diff)"; (cd $$m && $(GO) mod tidy -diff) || exit 1; done
	@$(MAKE) --no-print-directory vet/workflows

.PHONY: apvet
apvet: ## Build the apvet workflow analyzer into bin/apvet
	$(GO) build -o bin/apvet ./apvet/cmd/apvet

# apvet is built from this repository (its module is in go.work) and run as
# go vet's tool over the examples' workflows (docs/apvet.md).
.PHONY: vet/workflows
vet/workflows: apvet ## Check the examples' workflows with apvet (go vet -vettool)
	$(GO) vet -vettool=$(CURDIR)/bin/apvet ./examples/...

.PHONY: bench
bench: postgres ## Run the benchmarks
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

# ARGS passes flags: make bench-compare ARGS="-rounds 5 -pgss".
.PHONY: bench-compare
bench-compare: postgres ## Measure atomicphase next to hand-written pgx on a durable PostgreSQL (docs/performance.md)
	$(GO) run ./cmd/bench-compare $(ARGS)

# Needs Citus installed into the PostgreSQL the harness finds (docs/scale.md).
# ARGS passes flags: make bench-scale ARGS="-workers 0,1,2,4 -node-cores 2 -clients 128".
.PHONY: bench-scale
bench-scale: ## Measure atomicphase next to hand-written pgx on plain PostgreSQL and Citus, 1..N workers (docs/scale.md)
	$(GO) run ./cmd/bench-scale $(ARGS)

.PHONY: fuzz
fuzz: ## Fuzz the fingerprint for a minute
	$(GO) test -run '^$$' -fuzz FuzzFingerprint -fuzztime 60s .

.PHONY: schema
schema: postgres ## Rewrite schema.sql from a database the migrations made
	$(PLAIN) $(GO) test -count=1 -run '^TestSchemaFileIsWhatTheMigrationsMake$$' . -args -update-schema

.PHONY: postgres
postgres:
	@./scripts/ensure-postgres

# The console's browser tests (apui) need a Chromium; the script installs
# Debian's when it is missing and apt-get can be used (CI), and otherwise
# the tests skip, except in CI (CI=true), where they fail.
.PHONY: chromium
chromium:
	@./scripts/ensure-chromium

.PHONY: screenshots
screenshots: postgres chromium ## Retake the console's screenshots in docs/console/ (headless Chromium)
	cd apui && ATOMICPHASE_SCREENSHOTS=$(CURDIR)/docs/console $(GO) test -count=1 -run TestConsoleInABrowser .
