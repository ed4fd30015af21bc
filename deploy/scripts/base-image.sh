#!/usr/bin/env bash
# Make the base image (default name debian:bookworm-slim) on this machine, for engines that
# cannot pull from a registry: Debian bookworm bootstrapped with debootstrap (minbase) and
# trimmed the way Debian's own slim image is (no documentation, manual pages or locales,
# no apt caches). Anyone who can pull the real image does not need this script.
#
#   base-image.sh [IMAGE]
#
# Nothing is done when the engine already has IMAGE. The root filesystem tarball is kept in
# $TENSOROPS_DEPLOY_CACHE (default /var/cache/tensorops-deploy), so a new engine imports it
# in seconds instead of bootstrapping again (delete the tarball to refresh it). Needs root
# and debootstrap; DEBIAN_MIRROR picks the mirror (default http://deb.debian.org/debian).
set -euo pipefail

IMAGE=${1:-debian:bookworm-slim}
CACHE=${TENSOROPS_DEPLOY_CACHE:-/var/cache/tensorops-deploy}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
TARBALL=$CACHE/$SUITE-slim-rootfs.tar.gz

say() { echo "base-image: $*" >&2; }

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    say "$IMAGE is already in the engine"
    exit 0
fi

if [ ! -s "$TARBALL" ]; then
    [ "$(id -u)" = 0 ] || { say "ERROR: debootstrap needs root"; exit 1; }
    command -v debootstrap >/dev/null 2>&1 || { say "ERROR: debootstrap is not installed (apt-get install debootstrap)"; exit 1; }
    mkdir -p "$CACHE"
    dir=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    trap 'rm -rf "$dir"' EXIT
    say "bootstrapping Debian $SUITE (minbase) from $MIRROR"
    debootstrap --variant=minbase "$SUITE" "$dir" "$MIRROR" > "$CACHE/debootstrap.log" 2>&1 \
        || { tail -n 20 "$CACHE/debootstrap.log" >&2; say "ERROR: debootstrap failed (log: $CACHE/debootstrap.log)"; exit 1; }

    # Later package installs leave out documentation, manual pages and locales, as in
    # Debian's slim image; the same files already installed go now (copyright notices stay).
    cat > "$dir/etc/dpkg/dpkg.cfg.d/docker-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
EOF
    find "$dir/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    find "$dir/usr/share/doc" -mindepth 1 -type d -empty -delete
    rm -rf "$dir"/usr/share/{groff,info,linda,lintian,locale,man}/*

    # apt as in a container image: no package cache kept, no translations, no suggestions
    # or recommendations pulled in by default.
    cat > "$dir/etc/apt/apt.conf.d/docker-slim" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::Languages "none";
APT::AutoRemove::SuggestsImportant "false";
EOF
    # Services are never started by package scripts inside an image build.
    printf '#!/bin/sh\nexit 101\n' > "$dir/usr/sbin/policy-rc.d"
    chmod 755 "$dir/usr/sbin/policy-rc.d"

    rm -f "$dir/etc/apt/sources.list"
    cat > "$dir/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${MIRROR%/debian}/debian-security
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/cache/apt/*.bin "$dir"/var/lib/apt/lists/* \
        "$dir"/var/log/*.log "$dir"/var/log/apt/* "$dir"/tmp/* "$dir"/root/.cache
    : > "$dir/etc/machine-id"
    tar -C "$dir" --numeric-owner -c . | gzip -1 > "$TARBALL.tmp"
    mv "$TARBALL.tmp" "$TARBALL"
    say "root filesystem cached in $TARBALL ($(du -h "$TARBALL" | cut -f1))"
fi

say "importing $TARBALL as $IMAGE"
docker import --change 'CMD ["bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    "$TARBALL" "$IMAGE" >/dev/null
docker image inspect "$IMAGE" --format "base-image: $IMAGE {{.Id}} {{.Size}} bytes" >&2
