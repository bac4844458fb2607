#!/usr/bin/env bash
# Bootstraps the local stand-in for debian:bookworm-slim into an empty
# directory: debootstrap minbase, slimmed the way the official slim image is
# (no docs, man pages or translations, apt keeps no caches), with bookworm's
# updates and security suites enabled and applied.
#
#   hack/images/base.sh ROOTFS_DIR
#
# Run as root. hack/images/build.sh calls it and turns the directory into the
# base image; the content of this file is that image's cache key, so any edit
# here rebuilds the base and every image on it.
set -euo pipefail

# All mounts (debootstrap's own, /proc and /dev for the upgrade) happen in a
# private mount namespace, so none can outlive this script, whatever stops it.
if [[ -z ${SANDPOD_BASE_UNSHARED:-} ]]; then
    exec env SANDPOD_BASE_UNSHARED=1 unshare --mount --propagation private -- "$0" "$@"
fi

SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}

root=${1:?usage: base.sh ROOTFS_DIR}
if [[ -e $root && -n $(ls -A "$root") ]]; then
    echo "base.sh: $root is not empty" >&2
    exit 2
fi
mkdir -p "$root"

echo "base: debootstrap --variant=minbase $SUITE from $MIRROR"
debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR"

echo "base: slimming and configuring apt like debian:$SUITE-slim"
cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
# Like debian:*-slim: leave out documentation, manuals and translations.
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
EOF
cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
echo 'Acquire::Languages "none";' >"$root/etc/apt/apt.conf.d/docker-no-languages"
echo 'Acquire::GzipIndexes "true";' >"$root/etc/apt/apt.conf.d/docker-gzip-indexes"
echo 'Apt::AutoRemove::SuggestsImportant "false";' >"$root/etc/apt/apt.conf.d/docker-autoremove-suggests"
rm -f "$root/etc/apt/sources.list"
cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY_MIRROR
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF

echo "base: applying $SUITE-updates and $SUITE-security"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    sh -c 'apt-get update -q && apt-get upgrade -y -q && apt-get clean'
umount -R "$root/dev" "$root/proc"

echo "base: removing caches, logs and host leftovers"
find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$root"/usr/share/{groff,info,linda,lintian/overrides,locale,man}/*
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
find "$root/var/log" -type f -delete
rm -rf "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old
rm -rf "$root"/tmp/* "$root"/var/tmp/*
# The container runtime provides these at run time.
rm -f "$root/etc/resolv.conf" "$root/etc/hostname"
if [[ -e $root/etc/machine-id ]]; then : >"$root/etc/machine-id"; fi
echo "base: done ($(du -sh --one-file-system "$root" | cut -f1))"
