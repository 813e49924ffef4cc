#!/usr/bin/env bash
# Installs the build into a temporary prefix and uses it as another project would: find_package
# from a CMake project (C and C++), pkg-config from a plain compiler line, `import kvtier` from the
# prefix's dist-packages, and the installed programs.
#   check_install.sh BUILD_DIR SOURCE_DIR PYTHON
set -euo pipefail
build=$1 src=$2 python=$3
work=$(mktemp -d /tmp/kvtier-install-XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
for f in bin/kvtierd bin/kvtier bin/kvtier-fsck lib/libkvtier.so include/kvtier.h \
         include/kvtier/inprocess/embedded_cache.h lib/cmake/kvtier/kvtierConfig.cmake lib/pkgconfig/kvtier.pc; do
  [[ -e $prefix/$f ]] || { echo "missing after install: $f"; exit 1; }
done
# The systemd unit names the installed kvtierd and passes systemd's own check (strict: a warning
# such as an unknown sandboxing value fails it too).
unit=$prefix/lib/systemd/system/kvtierd.service
grep -q "^ExecStart=$prefix/bin/kvtierd " "$unit" || { echo "the unit does not start $prefix/bin/kvtierd"; exit 1; }
if command -v systemd-analyze >/dev/null; then
  out=$(systemd-analyze verify "$unit" 2>&1) || { echo "$out"; exit 1; }
  [[ -z $out ]] || { echo "systemd-analyze verify: $out"; exit 1; }
fi
[[ -e $prefix/share/doc/kvtier/README.md ]] || { echo "missing after install: share/doc/kvtier/README.md"; exit 1; }

# Internal headers stay out of the install.
if [[ -e $prefix/include/kvtier/tiers/ssd/ssd_tier.h || -e $prefix/include/kvtier/cache/tiered_cache.h ]]; then
  echo "internal headers were installed"; exit 1
fi

cmake -S "$src/tests/install/consumer" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null
"$work/consumer/consumer_c"
"$work/consumer/consumer_cpp"

PKG_CONFIG_PATH=$prefix/lib/pkgconfig cc -std=c11 -o "$work/pc_consumer" "$src/tests/install/consumer/main.c" \
  $(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs kvtier)
LD_LIBRARY_PATH=$prefix/lib "$work/pc_consumer"

pydir=$(cd "$prefix" && ls -d lib/python3*/*-packages)
PYTHONPATH=$prefix/$pydir "$python" - "$prefix" <<'PY'
import sys
import kvtier
assert kvtier.__file__.startswith(sys.argv[1]), kvtier.__file__
with kvtier.Cache("tiny", ram="1M") as c:
    import numpy as np
    x = np.arange(16 * 2 * 64, dtype=np.uint16).reshape(16, 2, 64)
    h = c.store(list(range(16)), None, [(x, x), (x, x)], dtype="bf16")
    assert np.asarray(c.fetch(list(range(16)))[0].layers[1][1]).tobytes() == x.tobytes()
print("python ok", kvtier.__version__)
PY
"$prefix/bin/kvtierd" --version
echo "install ok"
