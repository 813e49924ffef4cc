#!/usr/bin/env bash
# `make package`'s .deb: built by CPack from the build tree, its dependencies Debian packages
# (found by dpkg-shlibdeps), its files under /usr.
#   check_package.sh BUILD_DIR
set -euo pipefail
build=$1
work=$(mktemp -d /tmp/kvtier-package-XXXXXX)
trap 'rm -rf "$work"' EXIT
(cd "$build" && cpack -G DEB -B "$work" >/dev/null)
deb=$(ls "$work"/kvtier_*.deb)
depends=$(dpkg-deb -f "$deb" Depends)
echo "Depends: $depends"
for lib in librocksdb liburing libvulkan python3; do
  grep -q "$lib" <<<"$depends" || { echo "Depends lacks $lib"; exit 1; }
done
files=$(dpkg-deb -c "$deb" | awk '{print $6}')
for f in ./usr/bin/kvtierd ./usr/bin/kvtier-fsck ./usr/lib/libkvtier.so.0 ./usr/include/kvtier.h \
         ./usr/lib/cmake/kvtier/kvtierConfig.cmake ./usr/lib/systemd/system/kvtierd.service \
         ./usr/share/kvtier/grafana/kvtier-dashboard.json ./usr/share/kvtier/prometheus/kvtier-rules.yml; do
  grep -qx "$f" <<<"$files" || { echo "the package lacks $f"; exit 1; }
done
grep -q '^./usr/lib/python3\.[0-9]*/dist-packages/kvtier/_kvtier\..*\.so$' <<<"$files" \
  || { echo "the package lacks the Python extension"; exit 1; }
# Read whole before grep: `grep -q` stops at the first match, and under pipefail the tar it cut off
# (SIGPIPE) failed this check now and then.
unit=$(dpkg-deb --fsys-tarfile "$deb" | tar -xO ./usr/lib/systemd/system/kvtierd.service)
grep -q '^ExecStart=/usr/bin/kvtierd ' <<<"$unit" || { echo "the packaged unit does not start /usr/bin/kvtierd"; exit 1; }
echo "package ok: $(basename "$deb")"
