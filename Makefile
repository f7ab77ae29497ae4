# Tollgate: `make run` serves the app with one Huey worker; `make test` runs the suite.
PYTHON ?= $(shell scripts/find-python)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# A name, not an address: passkeys are made for a host name (WebAuthn takes no IP address).
HOST ?= localhost
PORT ?= 8000

.PHONY: install run test test-busy test-containers image lint bench docs clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Links in mail and webhooks point where this serves, unless TOLLGATE_BASE_URL says otherwise.
run: export TOLLGATE_BASE_URL ?= http://$(HOST):$(PORT)
run: export DEBUG ?= 1
run: install
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py demo
	@echo "Serving $(TOLLGATE_BASE_URL)/ (port $(PORT)) with one Huey consumer and the events server; Ctrl-C stops all."
	@echo "Mail is printed here and listed at $(TOLLGATE_BASE_URL)/dev/mail/."
	$(BIN)/python scripts/serve-dev $(HOST):$(PORT)

lint: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# The sign-on tests run a real OpenID Connect provider (Node.js, from its lock file).
OIDC_PROVIDER := tests/support/oidc_provider/node_modules/.package-lock.json
$(OIDC_PROVIDER): tests/support/oidc_provider/package-lock.json
	cd tests/support/oidc_provider && npm ci --no-audit --no-fund --loglevel=error

# The accessibility check of every page in the browser tests (axe-core, from its lock file).
AXE := tests/support/axe/node_modules/.package-lock.json
$(AXE): tests/support/axe/package-lock.json
	cd tests/support/axe && npm ci --no-audit --no-fund --loglevel=error

# The suite runs on parallel workers (pytest-xdist, the -n of pyproject.toml): each has its
# own database, queue, spool, ports and files; then the few marked serial, alone.
# PYTEST_ARGS adds options (-n 2, a path, -k).
test: lint $(OIDC_PROVIDER) $(AXE)
	scripts/test $(PYTEST_ARGS)

# The suite on a machine that other jobs keep busy: busy loops hold every core meanwhile.
test-busy: lint $(OIDC_PROVIDER) $(AXE)
	scripts/busy $(BUSY_LOOPS) -- scripts/test $(PYTEST_ARGS)

# The image (Containerfile), with podman or docker. BASE= names another Python base image; where
# no registry is reachable, `scripts/container-base` makes one from Debian's packages:
#   make image BASE=localhost/tollgate-base:trixie
IMAGE ?= localhost/tollgate:latest
CONTAINER ?= podman
image:
	$(CONTAINER) build --format docker -t $(IMAGE) $(if $(BASE),--build-arg BASE=$(BASE)) \
		$(IMAGE_BUILD_ARGS) -f Containerfile .

# The image built on the offline base and run in each role with podman: the compose stack,
# the Kubernetes manifests (podman kube play), a consumer container killed, an upgrade.
# Needs PostgreSQL on 127.0.0.1:5432 and Redis on 6379, as the PostgreSQL pass does.
test-containers: lint
	TOLLGATE_CONTAINER_TESTS=1 DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/tollgate_containers} \
		TOLLGATE_REDIS_URL=$${TOLLGATE_REDIS_URL:-redis://127.0.0.1:6379/0} \
		scripts/test -n 0 tests/containers $(PYTEST_ARGS)

bench: install
	$(BIN)/python bench/run.py

clean:
	rm -rf var/*.sqlite3* var/screenshots var/bench.json

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
	@echo "the site is in var/site/ (index.html)"
