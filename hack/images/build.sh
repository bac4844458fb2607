#!/usr/bin/env bash
# Builds sandpod's container images with no registry and no Docker engine, and
# imports them into the local cluster's containerd.
#
#   hack/images/build.sh [--no-import] [--rebuild] [--refresh-base] [--prune] [IMAGE...]
#   hack/images/build.sh --list
#
# IMAGE is a short name (python, node, bash, go, csharp, operator, gateway,
# egress-proxy);
# default: all of them. How it works:
#   1. base: hack/images/base.sh bootstraps a Debian bookworm rootfs, committed
#      as a local stand-in for debian:bookworm-slim (buildah storage in the
#      cache below);
#   2. the runner: images/runner is built with the local Go toolchain;
#   3. each image: `buildah bud` of the real Dockerfile under images/ with
#      BASE_IMAGE pointing at the local base, saved as a docker-archive tar;
#   4. import: `ctr -n k8s.io images import` into $CONTAINERD_ADDRESS, skipped
#      for an image containerd already has with the same digest.
# Everything is cached under $SANDPOD_IMAGE_CACHE (default
# ~/.cache/sandpod/images): an image whose inputs (Dockerfile and build
# context, runner source, base, this script) did not change is not rebuilt.
#
# Options:
#   --no-import     build only; do not import into containerd
#   --rebuild       ignore the caches (ours and buildah's layer cache)
#   --refresh-base  bootstrap the base again (picks up Debian updates), which
#                   rebuilds every image
#   --prune         afterwards, drop buildah's layer cache (dangling images) to
#                   free disk; the next change to an image rebuilds it whole
#   --list          print the image references and exit
# Environment: CONTAINERD_ADDRESS (default <repo>/.cluster/run/containerd.sock),
# SANDPOD_IMAGE_CACHE, DEBIAN_MIRROR, SANDPOD_IMAGE_TAG (default: the project's version;
# another tag builds a branch's images beside main's, e.g. for its own tests).
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# apt-get that waits while another apt-get or dpkg holds its lock (hack/cluster/lib.sh).
source "$REPO_ROOT/hack/cluster/lib.sh"
SCRIPT_DIR=$REPO_ROOT/hack/images
IMAGES_DIR=$REPO_ROOT/images
RUNNER_DIR=$IMAGES_DIR/runner
CACHE_DIR=${SANDPOD_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sandpod/images}
CONTAINERD_ADDRESS=${CONTAINERD_ADDRESS:-$REPO_ROOT/.cluster/run/containerd.sock}
CONTAINERD_NAMESPACE=k8s.io
IMAGE_PREFIX=localhost/sandpod

SANDBOX_IMAGES=(python node bash go csharp)
PLATFORM_IMAGES=(operator gateway egress-proxy)

log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() {
    printf '[images] ERROR: %s\n' "$*" >&2
    exit 1
}

# The image tag is the project's version: pyproject.toml is its one place.
project_version() {
    sed -n '/^\[project\]/,/^\[/ s/^version *= *"\([^"]*\)".*/\1/p' "$REPO_ROOT/pyproject.toml" | head -n1
}

is_sandbox_image() {
    local name=$1 candidate
    for candidate in "${SANDBOX_IMAGES[@]}"; do
        [[ $candidate == "$name" ]] && return 0
    done
    return 1
}

# Every image this tree can build: sandbox images whose Dockerfile exists
# (go and csharp are optional) and the operator and gateway.
available_images() {
    local name
    for name in "${SANDBOX_IMAGES[@]}"; do
        [[ -f $IMAGES_DIR/$name/Dockerfile ]] && echo "$name"
    done
    printf '%s\n' "${PLATFORM_IMAGES[@]}"
}

dockerfile_of() {
    if is_sandbox_image "$1"; then echo "$IMAGES_DIR/$1/Dockerfile"; else echo "$IMAGES_DIR/sandpod/Dockerfile"; fi
}

# Files of the working tree under the given paths (tracked or not, minus what
# .gitignore excludes), NUL-separated, relative to the repo root.
tree_files() {
    if git -C "$REPO_ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        local file
        git -C "$REPO_ROOT" ls-files -z --cached --others --exclude-standard -- "$@" |
            while IFS= read -r -d '' file; do
                [[ -f $REPO_ROOT/$file ]] && printf '%s\0' "$file"
            done
    else
        (cd "$REPO_ROOT" && find "$@" -type f -not -path '*/__pycache__/*' -print0 2>/dev/null)
    fi
}

# A content hash of a directory: names, modes and contents, not mtimes.
tree_hash() {
    tar -C "$1" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - . | sha256sum | cut -c1-64
}

sha256_of() { sha256sum "$@" | cut -c1-64; }

# Runs a long command with its output in a log file, printing progress: each
# new Dockerfile step, and otherwise a heartbeat every 20 s.
run_logged() {
    local label=$1 logfile=$2
    shift 2
    local started=$SECONDS next_heartbeat=$((SECONDS + 20)) last_step="" step pid
    "$@" >"$logfile" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        sleep 1
        step=$(grep -E '^(\[[0-9]+/[0-9]+\] )?STEP [0-9]+/[0-9]+:|^base: ' "$logfile" | tail -n1 || true)
        if [[ -n $step && $step != "$last_step" ]]; then
            step=${step#"$label: "}
            log "  $label: ${step:0:110}"
            last_step=$step
            next_heartbeat=$((SECONDS + 20))
        elif ((SECONDS >= next_heartbeat)); then
            log "  $label: working ($((SECONDS - started))s): $(tail -n1 "$logfile" | tr -d '\r' | cut -c1-90)"
            next_heartbeat=$((SECONDS + 20))
        fi
    done
    if ! wait "$pid"; then
        printf '[images] ---- last lines of %s ----\n' "$logfile" >&2
        tail -n 40 "$logfile" >&2
        die "$label failed after $((SECONDS - started))s (full log: $logfile)"
    fi
    log "  $label: done in $((SECONDS - started))s"
}

ensure_command() {
    local command=$1 package=$2
    command -v "$command" >/dev/null 2>&1 && return 0
    log "installing $package (for $command) from Debian"
    if [[ -z ${APT_UPDATED:-} ]]; then
        apt-get update -q >/dev/null
        APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$package" >/dev/null
    command -v "$command" >/dev/null 2>&1 || die "installing $package did not provide $command"
}

buildah_() {
    buildah --root "$CACHE_DIR/storage" --runroot "$CACHE_DIR/run" --storage-driver overlay "$@"
}

# --- the runner -------------------------------------------------------------

RUNNER_BINARY=""
build_runner() {
    [[ -d $RUNNER_DIR/cmd/sandpod-runner ]] ||
        die "the runner source is missing: $RUNNER_DIR/cmd/sandpod-runner does not exist, and every sandbox image needs the runner. Build only the operator and gateway with: $0 operator gateway"
    if ! command -v go >/dev/null 2>&1; then
        [[ -x /usr/local/go/bin/go ]] || die "no Go toolchain (go) in PATH or /usr/local/go/bin: needed to build the runner"
        PATH=$PATH:/usr/local/go/bin
    fi
    local staged key
    staged=$(mktemp -d "$CACHE_DIR/tmp.runner-src.XXXXXX")
    TEMP_PATHS+=("$staged")
    (cd "$REPO_ROOT" && tree_files images/runner | tar --null -T - -cf -) | tar -C "$staged" -xf -
    key=$({
        tree_hash "$staged"
        go version
        echo "CGO_ENABLED=0 go build -trimpath -ldflags '-s -w'"
    } | sha256sum | cut -c1-64)
    RUNNER_BINARY=$CACHE_DIR/runner/sandpod-runner
    if [[ -x $RUNNER_BINARY && $(cat "$CACHE_DIR/runner/key" 2>/dev/null) == "$key" ]]; then
        log "runner: cached ($(du -h "$RUNNER_BINARY" | cut -f1))"
        return
    fi
    mkdir -p "$CACHE_DIR/runner"
    rm -f "$CACHE_DIR/runner/key"
    run_logged "runner" "$CACHE_DIR/logs/runner.log" \
        env -C "$RUNNER_DIR" CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' \
        -o "$RUNNER_BINARY.new" ./cmd/sandpod-runner
    mv -f "$RUNNER_BINARY.new" "$RUNNER_BINARY"
    echo "$key" >"$CACHE_DIR/runner/key"
    log "runner: built ($(du -h "$RUNNER_BINARY" | cut -f1))"
}

# --- the base image ---------------------------------------------------------

BASE_REF=""
BASE_ID=""
build_base() {
    local key
    key=$(sha256_of "$SCRIPT_DIR/base.sh")
    BASE_REF=$IMAGE_PREFIX/base:bookworm-${key:0:12}
    if [[ -z $REFRESH_BASE ]] && buildah_ inspect --type image "$BASE_REF" >/dev/null 2>&1; then
        log "base: cached ($BASE_REF)"
    else
        log "base: bootstrapping Debian bookworm (about a minute)"
        local rootfs container mountpoint
        rootfs=$(mktemp -d "$CACHE_DIR/tmp.base.XXXXXX")
        TEMP_PATHS+=("$rootfs")
        rmdir "$rootfs"
        run_logged "base" "$CACHE_DIR/logs/base.log" "$SCRIPT_DIR/base.sh" "$rootfs"
        container=$(buildah_ from scratch)
        WORKING_CONTAINER=$container
        mountpoint=$(buildah_ mount "$container")
        tar -C "$rootfs" --numeric-owner -cf - . | tar -C "$mountpoint" --numeric-owner -xpf -
        buildah_ umount "$container" >/dev/null
        buildah_ config \
            --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
            --cmd bash --os linux --arch amd64 \
            --label org.opencontainers.image.description="local stand-in for debian:bookworm-slim" \
            "$container"
        buildah_ commit --quiet --rm "$container" "$BASE_REF" >/dev/null
        WORKING_CONTAINER=""
        log "base: committed $BASE_REF"
    fi
    BASE_ID=$(buildah_ inspect --type image --format '{{.FromImageID}}' "$BASE_REF")
}

# --- one image --------------------------------------------------------------

# Copies the build context of an image into the empty directory $2.
stage_context() {
    local name=$1 context=$2
    if is_sandbox_image "$name"; then
        (cd "$REPO_ROOT" && tree_files "images/$name" | grep -zv "^images/$name/sandpod-runner\$" |
            tar --null -T - -cf -) | tar -C "$context" --strip-components=2 -xf -
        cp "$RUNNER_BINARY" "$context/sandpod-runner"
        chmod 0755 "$context/sandpod-runner"
    else
        # What Dockerfile.dockerignore lets in for a Docker build from the repo root.
        (cd "$REPO_ROOT" && tree_files pyproject.toml README.md LICENSE contract operator api web proxy |
            tar --null -T - -cf -) | tar -C "$context" -xf -
    fi
}

# Sets IMAGE_STATE[name] to "built" or "cached".
declare -A IMAGE_STATE=()
build_image() {
    local name=$1 ref=$IMAGE_PREFIX/$1:$VERSION dockerfile context key target=()
    dockerfile=$(dockerfile_of "$name")
    is_sandbox_image "$name" || target=(--target "$name")
    context=$(mktemp -d "$CACHE_DIR/tmp.context-$name.XXXXXX")
    TEMP_PATHS+=("$context")
    stage_context "$name" "$context"
    key=$({
        echo "$ref ${target[*]}"
        echo "base $BASE_ID"
        echo "dockerfile $(sha256_of "$dockerfile")"
        echo "context $(tree_hash "$context")"
        echo "script $(sha256_of "${BASH_SOURCE[0]}")"
    } | sha256sum | cut -c1-64)
    local archive=$OUT_DIR/$name.tar
    if [[ -z $REBUILD && -f $archive && $(cat "$OUT_DIR/$name.key" 2>/dev/null) == "$key" ]]; then
        IMAGE_STATE[$name]=cached
        log "$name: cached ($ref)"
        return
    fi
    log "$name: building $ref from ${dockerfile#"$REPO_ROOT"/}"
    rm -f "$OUT_DIR/$name.key"
    local previous_id
    previous_id=$(buildah_ inspect --type image --format '{{.FromImageID}}' "$ref" 2>/dev/null || true)
    local no_cache=() host_ca=()
    [[ -n $REBUILD ]] && no_cache=(--no-cache)
    # Downloads during the build (pip, npm) trust what this host trusts, which
    # may include a TLS-intercepting proxy's CA: a build secret, not kept.
    local host_bundle=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
    [[ -r $host_bundle ]] && host_ca=(--secret "id=build-ca,src=$host_bundle")
    run_logged "$name" "$CACHE_DIR/logs/$name.log" \
        buildah_ bud --isolation chroot --network host --pull=never --layers --force-rm --format docker \
        "${no_cache[@]}" "${target[@]}" "${host_ca[@]}" \
        --build-arg "BASE_IMAGE=$BASE_REF" \
        -f "$dockerfile" -t "$ref" "$context"
    buildah_ push --quiet "$ref" "docker-archive:$archive.new:$ref" >>"$CACHE_DIR/logs/$name.log" 2>&1 ||
        die "$name: saving $ref to $archive failed (log: $CACHE_DIR/logs/$name.log)"
    mv -f "$archive.new" "$archive"
    sha256_of "$archive" >"$OUT_DIR/$name.sha256"
    echo "$key" >"$OUT_DIR/$name.key"
    IMAGE_STATE[$name]=built
    # The image this build replaced is no longer needed; its layers that the
    # layer cache still uses stay.
    if [[ -n $previous_id && $previous_id != $(buildah_ inspect --type image --format '{{.FromImageID}}' "$ref") ]]; then
        buildah_ rmi "$previous_id" >/dev/null 2>&1 || true
    fi
}

# --- import -----------------------------------------------------------------

ctr_() { ctr --address "$CONTAINERD_ADDRESS" --namespace "$CONTAINERD_NAMESPACE" "$@"; }

containerd_digest() {
    ctr_ images ls "name==$1" 2>/dev/null | awk 'NR > 1 { print $3 }'
}

# Sets IMPORT_STATE[name]. The digest containerd gives an imported archive
# depends only on the archive's content, so it is recorded per archive hash:
# an image present under that digest is the one we would import.
declare -A IMPORT_STATE=()
import_image() {
    local name=$1 ref=$IMAGE_PREFIX/$1:$VERSION key present recorded
    [[ -f $OUT_DIR/$name.sha256 ]] || sha256_of "$OUT_DIR/$name.tar" >"$OUT_DIR/$name.sha256"
    key=$(cat "$OUT_DIR/$name.sha256")
    present=$(containerd_digest "$ref")
    recorded=$(cat "$IMPORTED_DIR/$name" 2>/dev/null || true)
    if [[ -n $present && $recorded == "$key $present" ]]; then
        IMPORT_STATE[$name]="present"
        return
    fi
    log "$name: importing into containerd ($CONTAINERD_ADDRESS)"
    ctr_ images import "$OUT_DIR/$name.tar" >>"$CACHE_DIR/logs/$name.import.log" 2>&1 ||
        die "$name: ctr images import failed (log: $CACHE_DIR/logs/$name.import.log)"
    present=$(containerd_digest "$ref")
    [[ -n $present ]] || die "$name: imported, but containerd does not list $ref"
    echo "$key $present" >"$IMPORTED_DIR/$name"
    IMPORT_STATE[$name]="imported"
}

# --- main -------------------------------------------------------------------

IMPORT=1
REBUILD=""
REFRESH_BASE=""
LIST=""
PRUNE=""
SELECTED=()
while (($#)); do
    case $1 in
        --no-import) IMPORT="" ;;
        --rebuild) REBUILD=1 ;;
        --refresh-base) REFRESH_BASE=1 ;;
        --list) LIST=1 ;;
        --prune) PRUNE=1 ;;
        -h | --help)
            sed -n '2,/^set -euo/ { /^set -euo/d; s/^# \{0,1\}//; p }' "${BASH_SOURCE[0]}"
            exit 0
            ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) SELECTED+=("$1") ;;
    esac
    shift
done

VERSION=${SANDPOD_IMAGE_TAG:-$(project_version)}
[[ -n $VERSION ]] || die "no version in $REPO_ROOT/pyproject.toml"
# Archives of another tag are kept apart, so a branch's build never replaces main's.
OUT_DIR=$CACHE_DIR/out${SANDPOD_IMAGE_TAG:+/$SANDPOD_IMAGE_TAG}
IMPORTED_DIR=$CACHE_DIR/imported${SANDPOD_IMAGE_TAG:+/$SANDPOD_IMAGE_TAG}
mapfile -t AVAILABLE < <(available_images)
((${#SELECTED[@]})) || SELECTED=("${AVAILABLE[@]}")
for name in "${SELECTED[@]}"; do
    [[ " ${AVAILABLE[*]} " == *" $name "* ]] || die "unknown image '$name' (available: ${AVAILABLE[*]})"
done

if [[ -n $LIST ]]; then
    for name in "${SELECTED[@]}"; do echo "$IMAGE_PREFIX/$name:$VERSION"; done
    exit 0
fi

[[ $(id -u) == 0 ]] || die "run as root: debootstrap, buildah's storage and containerd's socket need it"
if [[ -n $IMPORT ]]; then
    [[ -S $CONTAINERD_ADDRESS ]] ||
        die "no containerd socket at $CONTAINERD_ADDRESS: start the cluster first (make cluster-up), set CONTAINERD_ADDRESS, or build only with --no-import"
fi

mkdir -p "$CACHE_DIR/logs" "$OUT_DIR" "$IMPORTED_DIR"
# One build at a time per cache: buildah storage and outputs are shared.
exec {lock_fd}>"$CACHE_DIR/lock"
if ! flock --nonblock "$lock_fd"; then
    log "another image build holds $CACHE_DIR/lock; waiting"
    flock "$lock_fd"
fi

TEMP_PATHS=()
WORKING_CONTAINER=""
cleanup() {
    [[ -n $WORKING_CONTAINER ]] && buildah_ rm "$WORKING_CONTAINER" >/dev/null 2>&1
    ((${#TEMP_PATHS[@]})) && rm -rf --one-file-system "${TEMP_PATHS[@]}"
    return 0
}
trap cleanup EXIT

ensure_command debootstrap debootstrap
ensure_command buildah buildah
[[ -n $IMPORT ]] && ensure_command ctr containerd

started=$SECONDS
for name in "${SELECTED[@]}"; do
    if is_sandbox_image "$name"; then
        build_runner
        break
    fi
done
build_base
for name in "${SELECTED[@]}"; do
    build_image "$name"
done
if [[ -n $IMPORT ]]; then
    for name in "${SELECTED[@]}"; do
        import_image "$name"
    done
else
    log "import skipped (--no-import): load an archive with ctr -n $CONTAINERD_NAMESPACE images import <tar>"
fi

if [[ -n $PRUNE ]]; then
    buildah_ rmi --prune >/dev/null
    log "pruned buildah's layer cache ($(du -sh "$CACHE_DIR/storage" | cut -f1) left in $CACHE_DIR/storage)"
fi

printf '\n%-34s %-7s %9s  %-9s %s\n' IMAGE BUILD SIZE IMPORT ARCHIVE
for name in "${SELECTED[@]}"; do
    archive=$OUT_DIR/$name.tar
    printf '%-34s %-7s %7sMB  %-9s %s\n' "$IMAGE_PREFIX/$name:$VERSION" "${IMAGE_STATE[$name]}" \
        "$(($(stat -c %s "$archive") / 1000000))" "${IMPORT_STATE[$name]:-skipped}" "$archive"
done
log "done in $((SECONDS - started))s (sizes are uncompressed; all images share the ${BASE_REF#"$IMAGE_PREFIX"/} layer)"
