#!/usr/bin/env bash
# The NEON attention code against the x86 code, bit for bit: tests/cross/att_bits.c built for
# 64-bit Arm (aarch64-linux-gnu-gcc, static) with the kernels it exercises, run under qemu-aarch64,
# and its hash compared with the native build's (ctest cross_neon_attention).
#   usage: tests/cross/neon-check.sh NATIVE_ATT_BITS SOURCE_DIR WORK_DIR
# Exits 0 when both builds pass their reference checks and print the same hash, 1 when not, 77
# (ctest: skipped) when the cross compiler or qemu is missing, saying which.
set -euo pipefail
native="$1" src="$2" work="$3"
cc="$(command -v aarch64-linux-gnu-gcc || true)"
qemu="$(command -v qemu-aarch64 || command -v qemu-aarch64-static || true)"
if [ -z "$cc" ] || [ -z "$qemu" ]; then
    echo "cross_neon_attention: SKIPPED: needs aarch64-linux-gnu-gcc and qemu-aarch64" \
         "(Debian: gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user; deploy/install-deps.sh" \
         "installs them)"
    exit 77
fi
mkdir -p "$work"
# the project's C flags that change arithmetic: no contraction of a * b + c into an FMA
flags=(-O2 -std=gnu11 -ffp-contract=off -Wall -Wextra -Werror -I"$src")
objs=()
for f in attention ops traits types ktypes_k kquantize; do
    "$cc" "${flags[@]}" -c "$src/kernels/cpu/$f.c" -o "$work/$f.o"
    objs+=("$work/$f.o")
done
"$cc" "${flags[@]}" -static "$src/tests/cross/att_bits.c" "${objs[@]}" -lm -o "$work/att_bits_arm"
want="$("$native")"
got="$("$qemu" "$work/att_bits_arm")"
echo "x86 ($(uname -m)): $want"
echo "arm (NEON, qemu):  $got"
if [ "$want" != "$got" ]; then
    echo "cross_neon_attention: FAILED: the NEON code's bits differ from the x86 code's"
    exit 1
fi
echo "cross_neon_attention: the same bits"
