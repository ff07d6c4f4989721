#!/bin/sh
# SPDX-License-Identifier: MIT
# Owns the 'nvml-abi' test: fetch the real nvml.h (get-nvml-header.sh, cached under the build directory),
# compile nvml-abi-types.c and nvml-abi-functions.c against it and our agent/nvml/nvml-abi.h — any
# mismatch is a static assertion failure, so a failed compile is a failed test — and run the result,
# which reports what that nvml.h was too old to confirm.
#
# Usage: nvml-abi.sh CC SOURCE_ROOT CACHE_DIR
set -eu

cc=${1:?usage: nvml-abi.sh CC SOURCE_ROOT CACHE_DIR}
src=${2:?}
cache=${3:?}
here="$src/tests/abi"

rc=0
inc=$(sh "$here/get-nvml-header.sh" "$cache") || rc=$?
[ "$rc" = 0 ] || exit "$rc"
echo "nvml-abi: using $inc/nvml.h"

out="$cache/nvml-abi-check"
if ! $cc -std=gnu11 -Wall -Wextra -Werror -I "$src/agent/nvml" -I "$inc" -o "$out" \
        "$here/nvml-abi-types.c" "$here/nvml-abi-functions.c"; then
        echo "nvml-abi: FAILED: agent/nvml/nvml-abi.h disagrees with $inc/nvml.h (the assertions above say where)." >&2
        exit 1
fi
exec "$out"
