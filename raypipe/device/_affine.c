/* uint8 -> float32/bfloat16 multiply-add in one memory pass, for the CPU DeviceLoader's normalise.
 *
 * affine_u8(src, dst, mul, add, inner, kind) -> None
 *
 * dst[i] = src[i] * mul[k] + add[k] with k = (i / inner) % len(mul): inner = 1 and constants tiled
 * along a row for channels-last memory (NHWC), inner = H*W for planar memory (NCHW). kind 0 writes
 * float32, kind 1 bfloat16 (computed in float32, rounded to nearest even once).
 *
 * affine_u8_planar(src, dst, mul, add, plane, kind) -> None
 *
 * The same arithmetic from interleaved to planar memory (NHWC in, contiguous NCHW out, as timm's
 * prefetcher yields): src holds images of `plane` pixels of C = len(mul) channels each, and
 * dst[n][c][p] = src[n][p][c] * mul[c] + add[c]. The transpose is done in the same pass, on blocks of
 * pixels that stay in the L1 cache while each of their C planes is written.
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

/* Interleaved -> planar: per image, blocks of BLOCK pixels; each channel's plane is written from the
 * block while it is in L1. The channel count is a constant in the specialised 3-channel loop, so the
 * compiler vectorises its strided loads. */
#define BLOCK 1024
#define DEFINE_PLANAR(NAME, OUT_T, MADD, STORE, ATTR)                                                    \
    ATTR static void NAME(const uint8_t *restrict s, OUT_T *restrict d, const float *restrict m,          \
                          const float *restrict a, size_t images, size_t C, size_t plane) {              \
        for (size_t n = 0; n < images; n++, s += plane * C, d += plane * C)                               \
            for (size_t p0 = 0; p0 < plane; p0 += BLOCK) {                                                \
                const size_t len = plane - p0 < BLOCK ? plane - p0 : BLOCK;                               \
                const uint8_t *sb = s + p0 * C;                                                           \
                if (C == 3) {                                                                             \
                    for (size_t k = 0; k < 3; k++) {                                                      \
                        OUT_T *restrict dk = d + k * plane + p0;                                          \
                        const float mk = m[k], ak = a[k];                                                 \
                        for (size_t j = 0; j < len; j++)                                                  \
                            dk[j] = STORE(MADD(sb[3 * j + k], mk, ak));                                   \
                    }                                                                                     \
                } else {                                                                                  \
                    for (size_t k = 0; k < C; k++) {                                                      \
                        OUT_T *restrict dk = d + k * plane + p0;                                          \
                        const float mk = m[k], ak = a[k];                                                 \
                        for (size_t j = 0; j < len; j++)                                                  \
                            dk[j] = STORE(MADD(sb[C * j + k], mk, ak));                                   \
                    }                                                                                     \
                }                                                                                         \
            }                                                                                             \
    }

typedef void (*planar_fn)(const uint8_t *, void *, const float *, const float *, size_t, size_t, size_t);

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
DEFINE_PLANAR(f32_planar_plain, float, PLAIN, STORE_F32, )
DEFINE_PLANAR(bf16_planar_plain, uint16_t, PLAIN, STORE_BF16, )
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define HAVE_FUSED_VARIANT 1
DEFINE_KERNEL(f32_fused, float, FUSED, STORE_F32, __attribute__((target("avx2,fma"))))
DEFINE_KERNEL(bf16_fused, uint16_t, FUSED, STORE_BF16, __attribute__((target("avx2,fma"))))
DEFINE_PLANAR(f32_planar_fused, float, FUSED, STORE_F32, __attribute__((target("avx2,fma"))))
DEFINE_PLANAR(bf16_planar_fused, uint16_t, FUSED, STORE_BF16, __attribute__((target("avx2,fma"))))
#endif

static kernel_fn kernels[2];
static planar_fn planar_kernels[2];
static int use_fused = 0;

/* The checks both entry points share; NULL when the buffers fit, else what is wrong. */
static const char *check_buffers(const Py_buffer *src, const Py_buffer *dst, const Py_buffer *mul,
                                 const Py_buffer *add, Py_ssize_t inner, int kind) {
    Py_ssize_t itemsize = kind == 0 ? 4 : 2;
    Py_ssize_t P = mul->len / (Py_ssize_t)sizeof(float);
    if (kind != 0 && kind != 1)
        return "kind must be 0 (float32) or 1 (bfloat16)";
    if (P < 1 || mul->len != add->len || mul->len % (Py_ssize_t)sizeof(float) != 0)
        return "mul and add must be float32 buffers of the same, non-zero length";
    if (inner < 1 || src->len % (inner * P) != 0)
        return "len(src) must be a multiple of its period times len(mul)";
    if (dst->len != src->len * itemsize)
        return "dst must hold one output value per src byte";
    return NULL;
}

static void release(Py_buffer *src, Py_buffer *dst, Py_buffer *mul, Py_buffer *add) {
    PyBuffer_Release(src);
    PyBuffer_Release(dst);
    PyBuffer_Release(mul);
    PyBuffer_Release(add);
}

static PyObject *affine_u8(PyObject *self, PyObject *args) {
    Py_buffer src, dst, mul, add;
    Py_ssize_t inner;
    int kind;
    if (!PyArg_ParseTuple(args, "y*w*y*y*ni", &src, &dst, &mul, &add, &inner, &kind))
        return NULL;
    const char *problem = check_buffers(&src, &dst, &mul, &add, inner, kind);
    if (problem == NULL) {
        Py_ssize_t P = mul.len / (Py_ssize_t)sizeof(float);
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
    release(&src, &dst, &mul, &add);
    if (problem != NULL) {
        PyErr_Format(PyExc_ValueError, "affine_u8: %s", problem);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *affine_u8_planar(PyObject *self, PyObject *args) {
    Py_buffer src, dst, mul, add;
    Py_ssize_t plane;
    int kind;
    if (!PyArg_ParseTuple(args, "y*w*y*y*ni", &src, &dst, &mul, &add, &plane, &kind))
        return NULL;
    const char *problem = check_buffers(&src, &dst, &mul, &add, plane, kind);
    if (problem == NULL) {
        size_t C = (size_t)(mul.len / (Py_ssize_t)sizeof(float));
        size_t images = (size_t)src.len / ((size_t)plane * C);
        Py_BEGIN_ALLOW_THREADS
        planar_kernels[kind]((const uint8_t *)src.buf, dst.buf, (const float *)mul.buf, (const float *)add.buf,
                             images, C, (size_t)plane);
        Py_END_ALLOW_THREADS
    }
    release(&src, &dst, &mul, &add);
    if (problem != NULL) {
        PyErr_Format(PyExc_ValueError, "affine_u8_planar: %s", problem);
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
    {"affine_u8_planar", affine_u8_planar, METH_VARARGS,
     "affine_u8_planar(src, dst, mul, add, plane, kind): dst[n][c][p] = src[n][p][c] * mul[c] + add[c] for "
     "images of `plane` pixels of len(mul) channels; types as affine_u8. ValueError on mismatched sizes."},
    {"fused", fused, METH_NOARGS, "fused() -> bool: whether the multiply-add is fused (as torch's, on this CPU)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_affine", NULL, -1, methods};

PyMODINIT_FUNC PyInit__affine(void) {
    kernels[0] = (kernel_fn)f32_plain;
    kernels[1] = (kernel_fn)bf16_plain;
    planar_kernels[0] = (planar_fn)f32_planar_plain;
    planar_kernels[1] = (planar_fn)bf16_planar_plain;
#ifdef HAVE_FUSED_VARIANT
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        kernels[0] = (kernel_fn)f32_fused;
        kernels[1] = (kernel_fn)bf16_fused;
        planar_kernels[0] = (planar_fn)f32_planar_fused;
        planar_kernels[1] = (planar_fn)bf16_planar_fused;
        use_fused = 1;
    }
#endif
    return PyModule_Create(&module);
}
