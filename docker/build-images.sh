#!/usr/bin/env bash
# Build the stage (CPU) image and the code-location image with podman, where no container
# registry is reachable (`make images`; tests/curation_dagster/ops/test_images.py). Three steps, each cached:
#
#  1. the base image: Debian bookworm with its Python 3.11 (python3, python3-venv), made by
#     debootstrap from the machine's Debian mirror and imported as $BASE. Built once per
#     machine; podman's image store is the cache (`podman rmi $BASE` to rebuild it).
#  2. a wheelhouse: every wheel the images install (the project's dependencies and those of the
#     images' extras, docker/requirements.py), collected by the host's pip with the host's
#     configuration (indexes, find-links, CA bundle), so the CPU torch build that pip finds
#     there is the one installed. Reused while that list of requirements is unchanged.
#  3. `podman build` of docker/Dockerfile.cpu and docker/Dockerfile.dagster on $BASE, offline
#     (--network none): pip installs from the wheelhouse mounted at /wheels only.
#
# Production builds the same Dockerfiles on python:3.11.11-slim-bookworm (their default base)
# with `docker build`; docs/kubernetes.md. The GPU image is not built here (CUDA wheels are GBs).
#
# Environment: PYTHON (the interpreter whose pip collects the wheels; default .venv/bin/python),
# CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/curation-dagster), TAG (default: the project's
# version), IMAGES (default "cpu dagster"), BASE (default localhost/debian-python:bookworm),
# DEBIAN_MIRROR (default: the first Debian mirror of /etc/apt, else deb.debian.org).
#
# `build-images.sh --base` builds step 1 alone, which needs neither the project's venv nor its pip:
# `make test` builds it beside the venv's install.
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
CACHE=${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/curation-dagster}
IMAGES=${IMAGES:-cpu dagster}
BASE=${BASE:-localhost/debian-python:bookworm}
SUITE=bookworm  # Python 3.11, as python:3.11.x-slim-bookworm, the production base

say() { printf '[images] %s\n' "$*" >&2; }
now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
case $# in
    0) base_only= ;;
    *) [ "$*" = --base ] || { say "usage: build-images.sh [--base]"; exit 2; }; base_only=1 ;;
esac

for tool in podman runc debootstrap; do
    command -v "$tool" >/dev/null || { say "needs $tool (apt-get install podman runc debootstrap)"; exit 3; }
done
[ "$(id -u)" = 0 ] || { say "needs root: debootstrap, and podman's storage as used here"; exit 3; }

# The sandbox podman runs in here: crun cannot create cgroups ("cgroups in hybrid mode not
# supported") so runc; and the container's rlimits may not exceed the caller's (podman's
# defaults do: "setrlimit: Operation not permitted"). One file, for builds and runs alike.
mkdir -p "$CACHE"
export CONTAINERS_CONF="$CACHE/containers.conf"
cat >"$CONTAINERS_CONF" <<'EOF'
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
runtime = "runc"
EOF

# --- 1. base image ------------------------------------------------------------------------
if podman image exists "$BASE"; then
    say "base $BASE: cached"
else
    mirror=${DEBIAN_MIRROR:-$(grep -rhv '^[[:space:]]*#' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
        | grep -oE 'https?://[^[:space:]]+/debian/?([[:space:]]|$)' | head -n1 | tr -d '[:space:]' || true)}
    mirror=${mirror:-http://deb.debian.org/debian}
    rootfs=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    trap 'rm -rf "$rootfs"' EXIT
    t=$(now)
    say "base: debootstrap $SUITE from $mirror"
    debootstrap --variant=minbase --include=python3,python3-venv "$SUITE" "$rootfs" "$mirror" >"$CACHE/debootstrap.log" \
        || { tail -n 20 "$CACHE/debootstrap.log" >&2; exit 1; }
    # An imported tarball has no config: give it the PATH and locale an image normally sets.
    tar -C "$rootfs" -c . | podman import --quiet \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' - "$BASE" >/dev/null
    rm -rf "$rootfs"
    trap - EXIT
    say "base $BASE: built in $(took "$t") s"
fi
[ -z "$base_only" ] || exit 0

# --- 2. wheelhouse --------------------------------------------------------------------------
extras_of() { sed -nE 's/^ARG EXTRAS=(.*)$/\1/p' "docker/Dockerfile.$1"; }
all_extras=$(for image in $IMAGES; do extras_of "$image"; done | tr ',' '\n' | sort -u | paste -sd, -)
wheels="$CACHE/wheels"
mkdir -p "$wheels"
requirements="$CACHE/requirements.txt"
{ "$PYTHON" docker/requirements.py; "$PYTHON" docker/requirements.py "$all_extras"
  echo "setuptools>=77"; } >"$requirements"  # setuptools: the build backend of the project itself
stamp="$wheels/.requirements.sha256"
if [ -f "$stamp" ] && sha256sum --status -c "$stamp" 2>/dev/null; then
    say "wheelhouse: cached"
else
    t=$(now)
    # The host's pip configuration decides where wheels come from; what the wheelhouse already
    # holds is reused. pip wheel's exit status survives the filter of one noisy warning.
    "$PYTHON" -m pip wheel --quiet --find-links "$wheels" --wheel-dir "$wheels" -r "$requirements" 2> >(
        grep -v "is ignored: it is neither a file nor a directory" >&2)
    sha256sum "$requirements" >"$stamp"
    say "wheelhouse: collected in $(took "$t") s ($(du -sh "$wheels" | cut -f1))"
fi

# --- 3. images ------------------------------------------------------------------------------
TAG=${TAG:-$("$PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')}
for image in $IMAGES; do
    case $image in
        cpu) name=curation-dagster/stage-cpu ;;
        dagster) name=curation-dagster/code-location ;;
        *) say "unknown image $image (cpu, dagster; the GPU image is built with docker, see docs)"; exit 2 ;;
    esac
    old=$(podman image inspect --format '{{.Id}}' "$name:$TAG" 2>/dev/null || true)
    t=$(now)
    podman build --quiet --network none \
        --volume "$wheels:/wheels:ro" \
        --build-arg "PYTHON_IMAGE=$BASE" \
        --build-arg PIP_FIND_LINKS=/wheels --build-arg PIP_NO_INDEX=1 --build-arg PIP_EXTRA_INDEX_URL= \
        -f "docker/Dockerfile.$image" -t "$name:$TAG" . >/dev/null
    new=$(podman image inspect --format '{{.Id}}' "$name:$TAG")
    # The image this tag named before is garbage now; nothing else of podman's store is touched.
    if [ -n "$old" ] && [ "$old" != "$new" ]; then podman rmi "$old" >/dev/null 2>&1 || true; fi
    size=$(podman image inspect --format '{{.Size}}' "$name:$TAG")
    say "$name:$TAG: built in $(took "$t") s, $((size / 1000000)) MB"
done
