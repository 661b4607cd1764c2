#!/bin/sh
# emu.sh - build the CUDA sources against the CPU emulator (tests/gpu/emu/include) and run
# gpu-check and the C suite's cuda tests with them: the kernels' indexing, scans, barriers
# and reductions, the device network and the check program itself, without a GPU; and kiln
# train --device cuda on 2 ranks under mpirun with nccl.h over MPI (dist.sh). Numbers
# and timings mean nothing here; only pass/fail does.
#   tests/gpu/emu/emu.sh [gpu-check arguments]      (from the repository root)
set -eu
cd "$(dirname "$0")/../../.."
E=build/emu${EMU_SAN:+-asan}
# EMU_SAN=1: AddressSanitizer on everything, so that a kernel reading or writing outside its
# device buffers (plain heap blocks here) is caught.
SAN=${EMU_SAN:+-fsanitize=address -fno-omit-frame-pointer}
mkdir -p "$E/src" "$E/obj"
MODS="core kernels/cpu train runtime export validate sign registry web sweep"
INC="-Iinclude -Ikernels $(for m in $MODS; do printf -- '-I%s ' $m; done)-Ibuild"
# The libraries libkiln links, as the Makefile names them.
PKGS=$(sed -n "s/^PKGS := //p" Makefile)
CFLAGS="$SAN -std=c11 -D_GNU_SOURCE -O1 -g -DKILN_HAVE_CUDA -DKILN_GIT_REV=\"emu\" -Wall -Wextra -Werror -Wno-unused-parameter -Wno-format-truncation $(pkg-config --cflags $PKGS)"
# -Wno-unknown-pragmas: nvcc's #pragma unroll means nothing to g++.
CXXFLAGS="$SAN -std=c++17 -O1 -g -DKILN_HAVE_CUDA -Itests/gpu/emu/include -Wall -Wextra -Werror -Wno-unused-parameter -Wno-unknown-pragmas $(pkg-config --cflags openblas)"
objs=""
python3 tests/gpu/emu/launch.py <kernels/cuda/cuda_int.h >"$E/src/cuda_int.h"
for f in kernels/cuda/*.cu; do
    b=$(basename "$f" .cu)
    python3 tests/gpu/emu/launch.py <"$f" >"$E/src/$b.cc"
    g++ $CXXFLAGS -I$E/src $INC -c "$E/src/$b.cc" -o "$E/obj/cu_$b.o"
    objs="$objs $E/obj/cu_$b.o"
done
g++ $CXXFLAGS -Wno-clobbered -c tests/gpu/emu/emu.cc -o "$E/obj/emu.o"
objs="$objs $E/obj/emu.o"
# Everything libkiln holds but the transports of data parallelism (MPI, NCCL).
for f in $(for m in $MODS; do ls $m/*.c; done | grep -v -e comm_mpi -e comm_nccl -e nccl_dl); do
    o=$E/obj/$(echo "$f" | tr / _).o
    gcc $CFLAGS $INC -c "$f" -o "$o"
    objs="$objs $o"
done
LIBS="$(pkg-config --libs $PKGS openblas) -lm -lpthread" # openblas: the emulated cuBLAS
# The transports: MPI, and NCCL through the emulator's nccl.h (tests/gpu/emu/nccl.cc: over MPI
# on host memory, which is what emulated device memory is).
MPI_CFLAGS=$(pkg-config --cflags ompi-c)
MPI_LIBS=$(pkg-config --libs ompi-c)
gcc $CFLAGS $MPI_CFLAGS $INC -c train/comm_mpi.c -DKILN_HAVE_NCCL -o "$E/obj/comm_mpi.o"
gcc $CFLAGS $MPI_CFLAGS $INC -Itests/gpu/emu/include -DKILN_HAVE_NCCL -c train/comm_nccl.c \
    -o "$E/obj/comm_nccl.o"
g++ $CXXFLAGS $MPI_CFLAGS -DOMPI_SKIP_MPICXX -c tests/gpu/emu/nccl.cc -o "$E/obj/nccl.o"
dist="$E/obj/comm_mpi.o $E/obj/comm_nccl.o $E/obj/nccl.o"
gcc $CFLAGS $INC -DKILN_HAVE_NCCL -c tests/gpu/check.c -o "$E/obj/check.o"
g++ $SAN -o "$E/gpu-check" "$E/obj/check.o" $objs $dist $LIBS $MPI_LIBS
# The kiln command itself, for the data-parallel run below.
cobjs=""
for f in cli/*.c; do
    o=$E/obj/$(echo "$f" | tr / _).o
    gcc $CFLAGS $INC -c "$f" -o "$o"
    cobjs="$cobjs $o"
done
g++ $SAN -o "$E/kiln" $cobjs $dist $objs $LIBS $MPI_LIBS
make -s build/tests.inc build/fuzz-targets.inc >/dev/null
tobjs=""
for f in tests/*.c tests/fuzz/*.c; do
    o=$E/obj/$(echo "$f" | tr / _).o
    gcc $CFLAGS $INC -c "$f" -o "$o"
    tobjs="$tobjs $o"
done
g++ $SAN -o "$E/run-tests" $tobjs $objs $LIBS
echo "== C suite's cuda tests on the emulator"
KILN_BUILD=$E "$E/run-tests" cuda
echo "== data parallelism on the emulator: kiln train --device cuda, 1 process and 2 ranks"
tests/gpu/emu/dist.sh "$E"
echo "== gpu-check on the emulator"
[ -n "${EMU_NO_CHECK:-}" ] || "$E/gpu-check" --out "$E/results.txt" --tiny-bench "$@"
