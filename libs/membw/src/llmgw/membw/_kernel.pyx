# cython: boundscheck=False, wraparound=False, cdivision=True
"""Read a buffer as fast as memory allows, with all threads or with one.

Eight independent accumulators keep the loop bound by memory, not by the
latency of one add chain; the compiler vectorises it (-O3 -march=native).
"""

from cython.parallel cimport prange
from libc.stdint cimport uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

cimport openmp


cdef inline double _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef uint64_t _read(const uint64_t* p, Py_ssize_t n) noexcept nogil:
    cdef uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0
    cdef Py_ssize_t i = 0
    while i + 8 <= n:
        a0 += p[i]
        a1 += p[i + 1]
        a2 += p[i + 2]
        a3 += p[i + 3]
        a4 += p[i + 4]
        a5 += p[i + 5]
        a6 += p[i + 6]
        a7 += p[i + 7]
        i += 8
    while i < n:
        a0 += p[i]
        i += 1
    return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7


cdef class Buffer:
    """A block of memory, touched once so every page is really there."""

    cdef uint64_t* data
    cdef Py_ssize_t words

    def __cinit__(self, Py_ssize_t nbytes):
        self.words = nbytes // 8
        self.data = <uint64_t*> malloc(self.words * 8)
        if self.data == NULL:
            raise MemoryError(f"cannot allocate {nbytes} bytes for the bandwidth buffer")
        memset(self.data, 1, self.words * 8)

    def __dealloc__(self):
        free(self.data)

    @property
    def nbytes(self):
        """Size of the buffer in bytes."""
        return self.words * 8

    def read_seconds(self, int threads):
        """Seconds to read the whole buffer once with `threads` threads."""
        cdef int t, nt = threads
        cdef Py_ssize_t chunk = (self.words + nt - 1) // nt
        cdef Py_ssize_t start, count
        cdef uint64_t total = 0
        cdef double t0, t1
        if nt < 1:
            raise ValueError(f"threads {threads} must be at least 1")
        t0 = _now()
        if nt == 1:
            total = _read(self.data, self.words)
        else:
            for t in prange(nt, nogil=True, num_threads=nt, schedule="static", chunksize=1):
                start = t * chunk
                count = chunk
                if start + count > self.words:
                    count = self.words - start
                if count > 0:
                    total += _read(self.data + start, count)
        t1 = _now()
        if total == 42:  # keeps the sum alive; never true for a buffer of ones
            print("")
        return t1 - t0


def max_threads():
    """Threads OpenMP would use by default on this machine."""
    return openmp.omp_get_max_threads()
