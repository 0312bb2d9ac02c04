# How many OpenMP threads a kernel over n values should start.

cdef enum:
    # Each thread gets at least this many values (256 KiB of float32): waking
    # a thread costs microseconds, and far more when the other cores are busy
    # (measured: 64K-value accumulate 300x slower with 2 threads on a loaded
    # 2-core machine), while a smaller slice is done in well under that.
    MIN_PER_THREAD = 65536


cdef inline int threads_for(Py_ssize_t n, int n_threads) noexcept nogil:
    cdef Py_ssize_t most = n // MIN_PER_THREAD
    if most <= 1 or n_threads <= 1:
        return 1
    return <int>most if most < n_threads else n_threads
