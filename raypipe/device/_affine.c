/* uint8 -> float32/bfloat16 multiply-add in one memory pass, for the CPU DeviceLoader's normalise.
 *
 * affine_u8(src, dst, mul, add, inner, kind) -> None
 *
 * dst[i] = src[i] * mul[k] + add[k] with k = (i / inner) % len(mul): inner = 1 and constants tiled
 * along a row for channels-last memory (NHWC), inner = H*W for planar memory (NCHW). kind 0 writes
 * float32, kind 1 bfloat16 (computed in float32, rounded to nearest even once).
 *
 * Why C: torch's CPU kernels need two passes here (an exact uint8 -> float copy, then an in-place
 * addcmul; the one mixed-dtype addcmul does not vectorise), each op costs microseconds of dispatch, and
 * above 32768 values an op fans out to torch's intra-op threads, which wait on each other on cores the
 * augmentation workers keep busy. One fused, single-threaded pass is 2-3x faster
 * (`python bench/pipeline_profile.py --normalise` measures both).
 *
 * Same bits as torch: on x86-64 torch's float kernels run fused multiply-adds when the CPU has
 * AVX2+FMA, plain ones otherwise, so this module picks the same at import (fused() says which). The
 * GIL is released during the pass. float32 output in channels-last rows goes out with streaming
 * (non-temporal) stores where the destination allows: the output is far larger than the caches, and
 * ordinary stores read each line before writing it (about twice the memory traffic).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16); /* round to nearest even (no NaN here) */
}

#define PLAIN(x, m, a) ((float)(x) * (m) + (a)) /* not contracted: built with -ffp-contract=off */
#define FUSED(x, m, a) __builtin_fmaf((float)(x), (m), (a))
#define STORE_F32(v) (v)
#define STORE_BF16(v) to_bf16(v)

/* One function per (output type, arithmetic): a period is inner * P elements of src. */
#define DEFINE_KERNEL(NAME, OUT_T, MADD, STORE, ATTR)                                                    \
    ATTR static void NAME(const uint8_t *restrict s, OUT_T *restrict d, const float *restrict m,          \
                          const float *restrict a, size_t periods, size_t P, size_t inner) {             \
        if (inner == 1) {                                                                                 \
            for (size_t r = 0; r < periods; r++, s += P, d += P)                                          \
                for (size_t j = 0; j < P; j++)                                                            \
                    d[j] = STORE(MADD(s[j], m[j], a[j]));                                                 \
            return;                                                                                       \
        }                                                                                                 \
        for (size_t r = 0; r < periods; r++)                                                              \
            for (size_t k = 0; k < P; k++, s += inner, d += inner) {                                      \
                const float mk = m[k], ak = a[k];                                                         \
                for (size_t j = 0; j < inner; j++)                                                        \
                    d[j] = STORE(MADD(s[j], mk, ak));                                                     \
            }                                                                                             \
    }

typedef void (*kernel_fn)(const uint8_t *, void *, const float *, const float *, size_t, size_t, size_t);

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
/* f32_fused for channels-last rows (inner 1) with 32-byte aligned rows of a multiple of 8 values, with
 * non-temporal stores: the output (4 bytes per input byte, a whole batch at a time) is far larger than
 * the caches and read next by someone else, so streaming it skips the read-for-ownership of every line
 * it writes. The same fused multiply-add per value, so the same bits. */
__attribute__((target("avx2,fma"))) static void f32_fused_stream(const uint8_t *restrict s, float *restrict d,
                                                                  const float *restrict m,
                                                                  const float *restrict a, size_t periods,
                                                                  size_t P) {
    for (size_t r = 0; r < periods; r++, s += P, d += P)
        for (size_t j = 0; j < P; j += 8) {
            __m256 x = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(s + j))));
            _mm256_stream_ps(d + j, _mm256_fmadd_ps(x, _mm256_loadu_ps(m + j), _mm256_loadu_ps(a + j)));
        }
    _mm_sfence();
}
#endif

DEFINE_KERNEL(f32_plain, float, PLAIN, STORE_F32, )
DEFINE_KERNEL(bf16_plain, uint16_t, PLAIN, STORE_BF16, )
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define HAVE_FUSED_VARIANT 1
DEFINE_KERNEL(f32_fused, float, FUSED, STORE_F32, __attribute__((target("avx2,fma"))))
DEFINE_KERNEL(bf16_fused, uint16_t, FUSED, STORE_BF16, __attribute__((target("avx2,fma"))))
#endif

static kernel_fn kernels[2];
static int use_fused = 0;

static PyObject *affine_u8(PyObject *self, PyObject *args) {
    Py_buffer src, dst, mul, add;
    Py_ssize_t inner;
    int kind;
    if (!PyArg_ParseTuple(args, "y*w*y*y*ni", &src, &dst, &mul, &add, &inner, &kind))
        return NULL;
    const char *problem = NULL;
    Py_ssize_t itemsize = kind == 0 ? 4 : 2;
    Py_ssize_t P = mul.len / (Py_ssize_t)sizeof(float);
    if (kind != 0 && kind != 1)
        problem = "kind must be 0 (float32) or 1 (bfloat16)";
    else if (P < 1 || mul.len != add.len || mul.len % (Py_ssize_t)sizeof(float) != 0)
        problem = "mul and add must be float32 buffers of the same, non-zero length";
    else if (inner < 1 || src.len % (inner * P) != 0)
        problem = "len(src) must be a multiple of inner * len(mul)";
    else if (dst.len != src.len * itemsize)
        problem = "dst must hold one output value per src byte";
    if (problem == NULL) {
        size_t periods = (size_t)(src.len / (inner * P));
        Py_BEGIN_ALLOW_THREADS
#ifdef HAVE_FUSED_VARIANT
        if (use_fused && kind == 0 && inner == 1 && P % 8 == 0 && ((uintptr_t)dst.buf & 31) == 0)
            f32_fused_stream((const uint8_t *)src.buf, dst.buf, (const float *)mul.buf, (const float *)add.buf,
                             periods, (size_t)P);
        else
#endif
            kernels[kind]((const uint8_t *)src.buf, dst.buf, (const float *)mul.buf, (const float *)add.buf,
                          periods, (size_t)P, (size_t)inner);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&mul);
    PyBuffer_Release(&add);
    if (problem != NULL) {
        PyErr_Format(PyExc_ValueError, "affine_u8: %s", problem);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *fused(PyObject *self, PyObject *noargs) { return PyBool_FromLong(use_fused); }

static PyMethodDef methods[] = {
    {"affine_u8", affine_u8, METH_VARARGS,
     "affine_u8(src, dst, mul, add, inner, kind): dst[i] = src[i] * mul[k] + add[k], k = (i // inner) % "
     "len(mul); src uint8, mul/add float32, dst float32 (kind 0) or bfloat16 bits (kind 1); all "
     "C-contiguous. ValueError on mismatched sizes."},
    {"fused", fused, METH_NOARGS, "fused() -> bool: whether the multiply-add is fused (as torch's, on this CPU)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_affine", NULL, -1, methods};

PyMODINIT_FUNC PyInit__affine(void) {
    kernels[0] = (kernel_fn)f32_plain;
    kernels[1] = (kernel_fn)bf16_plain;
#ifdef HAVE_FUSED_VARIANT
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        kernels[0] = (kernel_fn)f32_fused;
        kernels[1] = (kernel_fn)bf16_fused;
        use_fused = 1;
    }
#endif
    return PyModule_Create(&module);
}
