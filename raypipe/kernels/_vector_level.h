/* Which vector loops an extension runs: one policy for _warp, _resample and _colorops (include after defining
 * HAVE_AVX2_VARIANT where the compiler can build AVX2/AVX-512 variants).
 *
 * use_avx2 / use_avx512 start at the fastest the CPU runs well; set_vector(level) changes them for tests
 * and benchmarks (0 scalar, 1 the fastest, 2 AVX2 only) and vector_path() names the one in use.
 * Add VECTOR_LEVEL_METHODS to the module's method table and call vector_level_init() in its init. */
#ifndef RAYPIPE_VECTOR_LEVEL_H
#define RAYPIPE_VECTOR_LEVEL_H

static int use_avx2 = 0, use_avx512 = 0;

#ifdef HAVE_AVX2_VARIANT
/* AVX-512 where it does not slow the core down: Skylake-SP and Cascade Lake Xeons lower a core's clock
 * while 512-bit floating-point code runs, which would tax the decode and resize around these loops; the
 * CPUs since (Ice Lake, Sapphire Rapids, Zen 4) barely do. VBMI2 is the mark of those later ones. */
static inline int avx512_usable(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vbmi2");
}
#endif

static inline void set_vector_level(long level) {
#ifdef HAVE_AVX2_VARIANT
    __builtin_cpu_init();
    use_avx2 = level != 0 && __builtin_cpu_supports("avx2");
    use_avx512 = level == 1 && avx512_usable();
#else
    (void)level;
#endif
}

static inline void vector_level_init(void) { set_vector_level(1); }

static PyObject *set_vector(PyObject *self, PyObject *arg) {
    long level = PyLong_AsLong(arg);
    if (level == -1 && PyErr_Occurred())
        return NULL;
    set_vector_level(level);
    return PyBool_FromLong(use_avx2);
}

static PyObject *vector_path(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(use_avx512 ? "avx512" : use_avx2 ? "avx2" : "scalar");
}

#define VECTOR_LEVEL_METHODS                                                                                  \
    {"set_vector", set_vector, METH_O,                                                                        \
     "set_vector(level) -> bool: 0 scalar, 1 the fastest vector loops the CPU runs well, 2 AVX2 only; "      \
     "whether a vector path is on."},                                                                         \
        {"vector_path", vector_path, METH_NOARGS, "vector_path() -> 'avx512', 'avx2' or 'scalar'."}

#endif
