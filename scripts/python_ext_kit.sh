#!/usr/bin/env bash
# `import kvtier` for another machine's Python: the H100 host runs Python 3.12 with torch, this
# project's Debian has 3.11 and no 3.12 headers (Debian sid has none either). A C extension is
# compiled against its Python's headers, but nothing else in kvtier cares which Python it serves.
# So the library is built here, where the Debian packages are, and only the thin extension
# (python/src/*.cc, pybind11) is compiled there, against that machine's Python:
#
#   scripts/python_ext_kit.sh pack KIT [BUILD_DIR]   # here: after `make build` (BUILD_DIR: build)
#   scripts/python_ext_kit.sh build KIT [PYTHON]     # there, in a copy of this tree: needs g++ >= 12,
#                                                    # PYTHON's headers and its pybind11 (pip's)
#   PYTHONPATH=KIT/python PYTHON -c 'import kvtier'
#
# KIT gets lib/ (libkvtier.so: the C++ front door with every module linked in, and the libraries
# it loads but the C and C++ runtimes, which the target has newer), include/ (the headers the
# extension's sources reach beyond this tree: spdlog, fmt, nlohmann, dlpack) and python/kvtier/ (the
# pure-Python package; `build` adds _kvtier<suffix>.so, which finds lib/ through its RPATH). The
# device call carries KIT (docs/benchmarks.md, "kvtier under a PyTorch engine").
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cmd=${1:-}; kit=${2:-}
[ -n "$cmd" ] && [ -n "$kit" ] || { sed -n '2,17p' "$0" >&2; exit 2; }

case "$cmd" in
pack)
  build=${3:-$here/build}
  lib=$build/capi/libkvtier.so
  [ -e "$lib" ] || { echo "no $lib: build first (make build)" >&2; exit 1; }
  rm -rf "$kit"; mkdir -p "$kit/lib" "$kit/include" "$kit/python/kvtier"
  cp -L "$lib" "$kit/lib/libkvtier.so.0"  # its SONAME
  ldd "$lib" | awk '/=> \//{print $3}' | while read -r dep; do
    case "$(basename "$dep")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
      *) cp -Ln "$dep" "$kit/lib/" ;;
    esac
  done
  for d in spdlog fmt nlohmann dlpack; do cp -rL "/usr/include/$d" "$kit/include/"; done
  cp "$here"/python/kvtier/*.py "$here"/python/kvtier/py.typed "$kit/python/kvtier/"
  du -sh "$kit" | awk '{print "kit: " $1 " in " $2}'
  ;;
build)
  py=${3:-python3}
  [ -e "$kit/lib/libkvtier.so.0" ] || { echo "$kit has no lib/libkvtier.so.0: pack it first" >&2; exit 1; }
  kit=$(cd "$kit" && pwd)
  suffix=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  # pybind11 as pip installs it beside torch, else its headers where pybind11-dev puts them.
  includes=$("$py" -m pybind11 --includes 2>/dev/null ||
             echo "-I$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')")
  out="$kit/python/kvtier/_kvtier$suffix"
  # The defines Debian's spdlog and fmt packages were built with (libspdlog-dev's CMake config).
  # RPATH, not RUNPATH: libkvtier.so's own libraries are found through it too.
  # shellcheck disable=SC2086
  ${CXX:-g++} -std=c++20 -O2 -fPIC -shared -fvisibility=hidden \
    -DSPDLOG_COMPILED_LIB -DSPDLOG_SHARED_LIB -DSPDLOG_FMT_EXTERNAL -DFMT_SHARED \
    -I"$here" -I"$kit/include" $includes \
    "$here"/python/src/module.cc "$here"/python/src/tensor_import.cc "$here"/python/src/tensor_export.cc \
    -L"$kit/lib" -l:libkvtier.so.0 -Wl,--disable-new-dtags,-rpath,'$ORIGIN/../../lib' -o "$out"
  cp "$here"/python/kvtier/*.py "$kit/python/kvtier/"
  PYTHONPATH="$kit/python" "$py" -c 'import kvtier; print("built", kvtier.__file__, kvtier.__version__)'
  ;;
*) echo "unknown command '$cmd': pack or build" >&2; exit 2 ;;
esac
