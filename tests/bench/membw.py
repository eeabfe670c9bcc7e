"""Memory bandwidth: the Cython kernel beside a C reference compiled here (and mbw if installed).

Run with `just bench`. Prints GB/s for all cores and one core, the reference's, and the ratio.
Figures on a shared 2-core machine are noisy; the ratio within one run is what counts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llmgw.membw import Bandwidth, buffer_size, last_level_cache_bytes, measure
from llmgw.membw._measure import _available_memory

C_REFERENCE = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <omp.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static uint64_t rd(const uint64_t *p, size_t n) {
  uint64_t a[8] = {0}; size_t i = 0;
  for (; i + 8 <= n; i += 8) for (int k = 0; k < 8; k++) a[k] += p[i + k];
  for (; i < n; i++) a[0] += p[i];
  return a[0]+a[1]+a[2]+a[3]+a[4]+a[5]+a[6]+a[7];
}
int main(int argc, char **argv) {
  size_t bytes = strtoull(argv[1], 0, 10), n = bytes / 8; int threads = atoi(argv[2]), passes = atoi(argv[3]);
  uint64_t *p = malloc(n * 8); memset(p, 1, n * 8); volatile uint64_t sink = 0; double best = 1e9;
  for (int r = 0; r <= passes; r++) {
    double t0 = now(); uint64_t s = 0;
    #pragma omp parallel for num_threads(threads) reduction(+:s) schedule(static, 1)
    for (int t = 0; t < threads; t++) {
      size_t c = (n + threads - 1) / threads, a = t * c;
      if (a < n) s += rd(p + a, a + c > n ? n - a : c);
    }
    double dt = now() - t0; sink += s; if (r && dt < best) best = dt;
  }
  printf("%.2f\n", bytes / best / 1e9); return (int)(sink == 42);
}
"""


def compile_reference(folder: Path) -> Path:
    src, exe = folder / "ref.c", folder / "ref"
    src.write_text(C_REFERENCE)
    subprocess.run(["gcc", "-O3", "-march=native", "-fopenmp", str(src), "-o", str(exe)], check=True)
    return exe


def c_reference(exe: Path, size: int, threads: int, passes: int) -> tuple[float, float]:
    def run(t: int) -> float:
        argv = [str(exe), str(size), str(t), str(passes)]
        return float(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)

    return run(threads), run(1)


def mbw(size: int) -> float | None:
    if not shutil.which("mbw"):
        return None
    out = subprocess.run(["mbw", "-q", "-n", "3", "-t", "0", str(size // 2**20)], capture_output=True, text=True).stdout
    rates = [float(line.split("Copy:")[1].split()[0]) for line in out.splitlines() if line.startswith("AVG")]
    return rates[0] / 1000 if rates else None  # MiB/s of copy; a different measure, shown for scale


ROUNDS = 3
"""The kernel and the reference take turns this many times; each keeps its best, so a neighbour's
load during one turn does not decide the ratio."""


def main() -> int:
    passes = 5
    size = buffer_size(last_level_cache_bytes(), _available_memory())
    threads = os.cpu_count() or 1
    if size is None:
        print("no honest buffer fits in this machine's memory; nothing measured")
        return 1
    ours_all = ours_one = ref_all = ref_one = 0.0
    seconds = []
    with tempfile.TemporaryDirectory() as d:
        exe = compile_reference(Path(d))
        for _ in range(ROUNDS):
            t0 = time.perf_counter()
            ours = measure(passes=passes, threads=threads)
            seconds.append(time.perf_counter() - t0)
            if ours is None:
                print("no honest buffer fits in this machine's memory; nothing measured")
                return 1
            ours_all, ours_one = max(ours_all, ours.all_cores_gbs), max(ours_one, ours.one_core_gbs)
            r_all, r_one = c_reference(exe, size, threads, passes)
            ref_all, ref_one = max(ref_all, r_all), max(ref_one, r_one)
    ours = Bandwidth(ours_all, min(ours_one, ours_all), threads, size)
    copy = mbw(size)
    print(
        f"buffer {size / 2**20:.0f} MiB, last-level cache {(last_level_cache_bytes() or 0) / 2**20:.1f} MiB, "
        f"{threads} threads, best of {passes} passes in each of {ROUNDS} turns taken in alternation; "
        f"one whole measure() took {min(seconds):.2f}s"
    )
    print(f"{'figure':<12}{'llmgw.membw':>14}{'C reference':>14}{'ratio':>8}")
    print(f"{'all cores':<12}{ours.all_cores_gbs:>11.2f} GB/s{ref_all:>9.2f} GB/s{ours.all_cores_gbs / ref_all:>8.1%}")
    print(f"{'one core':<12}{ours.one_core_gbs:>11.2f} GB/s{ref_one:>9.2f} GB/s{ours.one_core_gbs / ref_one:>8.1%}")
    print(f"mbw copy: {copy:.2f} GB/s" if copy else "mbw: not installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
