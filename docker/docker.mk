# sluice - MIT licence.
# `make test-docker`: the container test, included by the Makefile. It builds
# docker/Dockerfile and runs docker/docker-compose.yml (two replicas, one
# Redis) with podman-compose, checks the shared limit and the HEALTHCHECK,
# and tears it all down (tests/docker/test-docker.sh). Slow (minutes on a
# cold cache; debootstrap of the base image the first time), so it is not
# part of `make test`. Needs root: it installs podman and friends with apt.

.PHONY: test-docker

test-docker:
	tests/docker/test-docker.sh
