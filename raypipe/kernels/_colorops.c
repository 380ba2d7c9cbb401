/* timm's auto-augment colour ops on packed RGB uint8 images, with Pillow's arithmetic.
 *
 *   lut(src, dst, table)              dst[p][c] = table[256 c + src[p][c]]      (Image.point)
 *   minmax(src) -> (lo_r, lo_g, lo_b, hi_r, hi_g, hi_b)                           (autocontrast)
 *   histogram(src, out)               out: 768 int64, channel-major             (Image.histogram)
 *   luma_sum(src) -> int              sum over pixels of convert("L")           (ImageStat mean)
 *   blend_const(src, dst, value, a)   Image.blend(constant image, src, a)       (Brightness, Contrast)
 *   blend_gray(src, dst, a)           Image.blend(src.convert("L").convert("RGB"), src, a)   (Color)
 *   blend_smooth(src, dst, w, h, a)   Image.blend(src.filter(SMOOTH), src, a)   (Sharpness)
 *
 * src and dst are C-contiguous HxWx3 uint8 buffers of the same length (dst may be src for lut).
 *
 * Why: through Pillow each op converts the array to Pillow's 4-byte layout and back, builds its table
 * in Python, and Sharpness runs its 3x3 filter in scalar floats (`python bench/profiles.py autoaug
 * --per-op` times each op). The arithmetic here is Pillow's, operation for operation: Blend.c's float blend
 * (`in1 + alpha * (in2 - in1)`, truncated, clipped when extrapolating), Filter.c's 3x3 kernel in
 * float with the kernel divided by its scale in float and 0.5 added first, border pixels copied,
 * Convert.c's L24 luma. So the bytes are Pillow's (tests compare with timm's ops on Pillow). The
 * float loops run eight values per AVX2 vector where the CPU has it, the blend sixteen per AVX-512
 * vector where _vector_level.h allows it: each lane does the scalar code's IEEE operations in the same
 * order, and the module is built without FP contraction, like Pillow's x86-64 build. The luma (for
 * Contrast's mean and Color's grey) runs sixteen pixels per step in AVX2 integer arithmetic, its RGB
 * triplets split and rebuilt with byte shuffles. The GIL is released around the loops.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HAVE_AVX2_VARIANT 1
#endif

#include "_vector_level.h" /* use_avx2 / use_avx512, set_vector(), vector_path(): the policy _warp uses */

/* Convert.c's L24(rgb) >> 16 */
static inline uint8_t luma(const uint8_t *p) {
    return (uint8_t)((p[0] * 19595 + p[1] * 38470 + p[2] * 7471 + 0x8000) >> 16);
}

/* Blend.c for one value. Its interpolation branch (0 <= a <= 1) truncates without clipping; its value
 * cannot leave [0, 255] there, so clip-then-truncate, the extrapolation branch, is the same for both. */
static inline uint8_t blend1(float a, int in1, int in2) {
    float t = (float)in1 + a * (float)(in2 - in1);
    if (t <= 0.0f)
        return 0;
    if (t >= 255.0f)
        return 255;
    return (uint8_t)t;
}

static void blend_row_scalar(const uint8_t *deg, const uint8_t *img, uint8_t *out, Py_ssize_t n, float a) {
    for (Py_ssize_t i = 0; i < n; i++)
        out[i] = blend1(a, deg[i], img[i]);
}

static long long luma_sum_scalar(const uint8_t *s, Py_ssize_t len) {
    long long total = 0;
    for (Py_ssize_t i = 0; i < len; i += 3)
        total += luma(s + i);
    return total;
}

/* a row of grey RGB triplets (convert("L").convert("RGB")) */
static void gray_row_scalar(const uint8_t *row, uint8_t *deg, Py_ssize_t n) {
    for (Py_ssize_t j = 0; j < n; j += 3)
        deg[j] = deg[j + 1] = deg[j + 2] = luma(row + j);
}

/* Filter.c's KERNEL1x3 sums for SMOOTH ((1 1 1, 1 5 1, 1 1 1) / 13): offset 0.5 first, then the row
 * below, the row itself, the row above, each as (left * k + centre * k) + right * k. */
static const float K_EDGE = 1.0f / 13.0f;
static const float K_MID = 5.0f / 13.0f;

static inline uint8_t smooth1(const uint8_t *above, const uint8_t *row, const uint8_t *below, Py_ssize_t j) {
    float ss = 0.5f;
    ss += (float)below[j - 3] * K_EDGE + (float)below[j] * K_EDGE + (float)below[j + 3] * K_EDGE;
    ss += (float)row[j - 3] * K_EDGE + (float)row[j] * K_MID + (float)row[j + 3] * K_EDGE;
    ss += (float)above[j - 3] * K_EDGE + (float)above[j] * K_EDGE + (float)above[j + 3] * K_EDGE;
    ss = ss < 0.0f ? 0.0f : ss;
    ss = ss > 255.0f ? 255.0f : ss;
    return (uint8_t)ss;
}

/* the smoothed interior of one row (bytes 3 .. n-4); the caller copies the border pixels */
static void smooth_row_scalar(const uint8_t *above, const uint8_t *row, const uint8_t *below, uint8_t *out,
                              Py_ssize_t n) {
    for (Py_ssize_t j = 3; j < n - 3; j++)
        out[j] = smooth1(above, row, below, j);
}

#ifdef HAVE_AVX2_VARIANT
__attribute__((target("avx2"))) static inline __m256 load8f(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

__attribute__((target("avx2"))) static inline void store8(uint8_t *p, __m256 v) {
    v = _mm256_min_ps(_mm256_max_ps(v, _mm256_setzero_ps()), _mm256_set1_ps(255.0f));
    __m256i i32 = _mm256_cvttps_epi32(v);
    __m128i i16 = _mm_packus_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1));
    _mm_storel_epi64((__m128i *)p, _mm_packus_epi16(i16, i16));
}

__attribute__((target("avx2"))) static void blend_row_avx2(const uint8_t *deg, const uint8_t *img, uint8_t *out,
                                                           Py_ssize_t n, float a) {
    const __m256 va = _mm256_set1_ps(a);
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i d = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(deg + i)));
        __m256i s = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(img + i)));
        __m256 diff = _mm256_cvtepi32_ps(_mm256_sub_epi32(s, d));
        store8(out + i, _mm256_add_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(va, diff)));
    }
    blend_row_scalar(deg + i, img + i, out + i, n - i, a);
}

/* the AVX2 loop's operations on sixteen values per vector */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void blend_row_avx512(const uint8_t *deg,
                                                                                 const uint8_t *img, uint8_t *out,
                                                                                 Py_ssize_t n, float a) {
    const __m512 va = _mm512_set1_ps(a), lo = _mm512_setzero_ps(), hi = _mm512_set1_ps(255.0f);
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(deg + i)));
        __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(img + i)));
        __m512 t = _mm512_add_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(va, _mm512_cvtepi32_ps(_mm512_sub_epi32(s, d))));
        t = _mm512_min_ps(_mm512_max_ps(t, lo), hi);
        _mm_storeu_si128((__m128i *)(out + i), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(t)));
    }
    blend_row_avx2(deg + i, img + i, out + i, n - i, a);
}

__attribute__((target("avx2"))) static void smooth_row_avx2(const uint8_t *above, const uint8_t *row,
                                                            const uint8_t *below, uint8_t *out, Py_ssize_t n) {
    const __m256 ke = _mm256_set1_ps(K_EDGE), km = _mm256_set1_ps(K_MID);
    Py_ssize_t j = 3;
    for (; j + 8 <= n - 3; j += 8) {
        __m256 ss = _mm256_set1_ps(0.5f);
        __m256 t = _mm256_add_ps(_mm256_mul_ps(load8f(below + j - 3), ke), _mm256_mul_ps(load8f(below + j), ke));
        ss = _mm256_add_ps(ss, _mm256_add_ps(t, _mm256_mul_ps(load8f(below + j + 3), ke)));
        t = _mm256_add_ps(_mm256_mul_ps(load8f(row + j - 3), ke), _mm256_mul_ps(load8f(row + j), km));
        ss = _mm256_add_ps(ss, _mm256_add_ps(t, _mm256_mul_ps(load8f(row + j + 3), ke)));
        t = _mm256_add_ps(_mm256_mul_ps(load8f(above + j - 3), ke), _mm256_mul_ps(load8f(above + j), ke));
        ss = _mm256_add_ps(ss, _mm256_add_ps(t, _mm256_mul_ps(load8f(above + j + 3), ke)));
        store8(out + j, ss);
    }
    for (; j < n - 3; j++)
        out[j] = smooth1(above, row, below, j);
}

/* pshufb masks splitting 16 packed RGB pixels (three 16-byte loads) into their R, G and B bytes:
 * SPLIT[c][v][k] picks pixel k's channel c from load v, or zeroes (0x80) when it lies in another load */
static int8_t SPLIT[3][3][16];
/* and back: 16 grey bytes to 48 bytes of RGB triplets, one mask per 16-byte store */
static int8_t TRIPLE[3][16];

static void init_masks(void) {
    for (int c = 0; c < 3; c++)
        for (int v = 0; v < 3; v++)
            for (int k = 0; k < 16; k++) {
                int byte = 3 * k + c - 16 * v;
                SPLIT[c][v][k] = (int8_t)(byte >= 0 && byte < 16 ? byte : 0x80);
            }
    for (int v = 0; v < 3; v++)
        for (int k = 0; k < 16; k++)
            TRIPLE[v][k] = (int8_t)((16 * v + k) / 3);
}

__attribute__((target("avx2"))) static inline __m128i channel16(__m128i a, __m128i b, __m128i c, int ch) {
    __m128i x = _mm_shuffle_epi8(a, _mm_loadu_si128((const __m128i *)SPLIT[ch][0]));
    x = _mm_or_si128(x, _mm_shuffle_epi8(b, _mm_loadu_si128((const __m128i *)SPLIT[ch][1])));
    return _mm_or_si128(x, _mm_shuffle_epi8(c, _mm_loadu_si128((const __m128i *)SPLIT[ch][2])));
}

/* luma() of eight pixels whose channels are the low eight bytes of r, g, b: Convert.c's L24 in int32 */
__attribute__((target("avx2"))) static inline __m256i luma8(__m128i r, __m128i g, __m128i b) {
    __m256i y = _mm256_mullo_epi32(_mm256_cvtepu8_epi32(r), _mm256_set1_epi32(19595));
    y = _mm256_add_epi32(y, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(g), _mm256_set1_epi32(38470)));
    y = _mm256_add_epi32(y, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(b), _mm256_set1_epi32(7471)));
    return _mm256_srli_epi32(_mm256_add_epi32(y, _mm256_set1_epi32(0x8000)), 16);
}

/* luma() of the 16 pixels at p (48 bytes), as pixels 0-7 in *lo and 8-15 in *hi */
__attribute__((target("avx2"))) static inline void luma16(const uint8_t *p, __m256i *lo, __m256i *hi) {
    __m128i a = _mm_loadu_si128((const __m128i *)p);
    __m128i b = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i r = channel16(a, b, c, 0), g = channel16(a, b, c, 1), bl = channel16(a, b, c, 2);
    *lo = luma8(r, g, bl);
    *hi = luma8(_mm_srli_si128(r, 8), _mm_srli_si128(g, 8), _mm_srli_si128(bl, 8));
}

__attribute__((target("avx2"))) static long long luma_sum_avx2(const uint8_t *s, Py_ssize_t len) {
    long long total = 0;
    Py_ssize_t i = 0;
    while (i + 48 <= len) {
        /* int32 lanes: at most 4096 steps x 2 x 255 per lane before they are added up */
        __m256i acc = _mm256_setzero_si256();
        for (int step = 0; step < 4096 && i + 48 <= len; step++, i += 48) {
            __m256i lo, hi;
            luma16(s + i, &lo, &hi);
            acc = _mm256_add_epi32(acc, _mm256_add_epi32(lo, hi));
        }
        int32_t lanes[8];
        _mm256_storeu_si256((__m256i *)lanes, acc);
        for (int k = 0; k < 8; k++)
            total += lanes[k];
    }
    return total + luma_sum_scalar(s + i, len - i);
}

__attribute__((target("avx2"))) static void gray_row_avx2(const uint8_t *row, uint8_t *deg, Py_ssize_t n) {
    Py_ssize_t j = 0;
    for (; j + 48 <= n; j += 48) {
        __m256i lo, hi;
        luma16(row + j, &lo, &hi);
        __m128i w0 = _mm_packus_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
        __m128i w1 = _mm_packus_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
        __m128i y = _mm_packus_epi16(w0, w1);
        for (int v = 0; v < 3; v++)
            _mm_storeu_si128((__m128i *)(deg + j + 16 * v),
                             _mm_shuffle_epi8(y, _mm_loadu_si128((const __m128i *)TRIPLE[v])));
    }
    gray_row_scalar(row + j, deg + j, n - j);
}
#endif

static void blend_row(const uint8_t *deg, const uint8_t *img, uint8_t *out, Py_ssize_t n, float a) {
#ifdef HAVE_AVX2_VARIANT
    if (use_avx512) {
        blend_row_avx512(deg, img, out, n, a);
        return;
    }
    if (use_avx2) {
        blend_row_avx2(deg, img, out, n, a);
        return;
    }
#endif
    blend_row_scalar(deg, img, out, n, a);
}

static long long luma_total(const uint8_t *s, Py_ssize_t len) {
#ifdef HAVE_AVX2_VARIANT
    if (use_avx2)
        return luma_sum_avx2(s, len);
#endif
    return luma_sum_scalar(s, len);
}

static void gray_row(const uint8_t *row, uint8_t *deg, Py_ssize_t n) {
#ifdef HAVE_AVX2_VARIANT
    if (use_avx2) {
        gray_row_avx2(row, deg, n);
        return;
    }
#endif
    gray_row_scalar(row, deg, n);
}

static void smooth_row(const uint8_t *above, const uint8_t *row, const uint8_t *below, uint8_t *out,
                       Py_ssize_t n) {
#ifdef HAVE_AVX2_VARIANT
    if (use_avx2) {
        smooth_row_avx2(above, row, below, out, n);
        return;
    }
#endif
    smooth_row_scalar(above, row, below, out, n);
}

/* ---- argument handling ---- */

static int rgb_len(Py_buffer *b, const char *name) {
    if (b->len % 3) {
        PyErr_Format(PyExc_ValueError, "%s: expected packed RGB bytes (a multiple of 3), got %zd", name, b->len);
        return 0;
    }
    return 1;
}

static int same_len(Py_buffer *src, Py_buffer *dst) {
    if (!rgb_len(src, "src"))
        return 0;
    if (dst->len != src->len) {
        PyErr_Format(PyExc_ValueError, "dst: expected %zd bytes like src, got %zd", src->len, dst->len);
        return 0;
    }
    return 1;
}

static PyObject *lut(PyObject *self, PyObject *args) {
    Py_buffer src, dst, table;
    if (!PyArg_ParseTuple(args, "y*w*y*", &src, &dst, &table))
        return NULL;
    PyObject *result = NULL;
    if (!same_len(&src, &dst))
        goto done;
    if (table.len != 768) {
        PyErr_Format(PyExc_ValueError, "table: expected 768 bytes (3 x 256), got %zd", table.len);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    const uint8_t *s = src.buf, *t = table.buf;
    uint8_t *d = dst.buf;
    for (Py_ssize_t i = 0; i < src.len; i += 3) {
        uint8_t r = t[s[i]], g = t[256 + s[i + 1]], b = t[512 + s[i + 2]];
        d[i] = r;
        d[i + 1] = g;
        d[i + 2] = b;
    }
    Py_END_ALLOW_THREADS;
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&table);
    return result;
}

static PyObject *minmax(PyObject *self, PyObject *arg) {
    Py_buffer src;
    if (PyObject_GetBuffer(arg, &src, PyBUF_SIMPLE) < 0)
        return NULL;
    if (!rgb_len(&src, "src") || src.len == 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "src: empty image");
        PyBuffer_Release(&src);
        return NULL;
    }
    uint8_t lo[3] = {255, 255, 255}, hi[3] = {0, 0, 0};
    Py_BEGIN_ALLOW_THREADS;
    const uint8_t *s = src.buf;
    Py_ssize_t i = 0;
#ifdef HAVE_AVX2_VARIANT
    /* 48 bytes = 16 pixels per step in three 16-byte vectors; lane l of vector v holds channel
     * (16 v + l) % 3, folded into its channel after the loop (SSE2, part of x86-64) */
    __m128i vlo[3], vhi[3];
    for (int v = 0; v < 3; v++) {
        vlo[v] = _mm_set1_epi8((char)0xFF);
        vhi[v] = _mm_setzero_si128();
    }
    for (; i + 48 <= src.len; i += 48) {
        for (int v = 0; v < 3; v++) {
            __m128i x = _mm_loadu_si128((const __m128i *)(s + i + 16 * v));
            vlo[v] = _mm_min_epu8(vlo[v], x);
            vhi[v] = _mm_max_epu8(vhi[v], x);
        }
    }
    uint8_t l8[48], h8[48];
    for (int v = 0; v < 3; v++) {
        _mm_storeu_si128((__m128i *)(l8 + 16 * v), vlo[v]);
        _mm_storeu_si128((__m128i *)(h8 + 16 * v), vhi[v]);
    }
    for (int k = 0; k < 48; k++) {
        if (l8[k] < lo[k % 3])
            lo[k % 3] = l8[k];
        if (h8[k] > hi[k % 3])
            hi[k % 3] = h8[k];
    }
#endif
    for (; i < src.len; i += 3) {
        for (int c = 0; c < 3; c++) {
            if (s[i + c] < lo[c])
                lo[c] = s[i + c];
            if (s[i + c] > hi[c])
                hi[c] = s[i + c];
        }
    }
    Py_END_ALLOW_THREADS;
    PyBuffer_Release(&src);
    return Py_BuildValue("(iiiiii)", lo[0], lo[1], lo[2], hi[0], hi[1], hi[2]);
}

static PyObject *histogram(PyObject *self, PyObject *args) {
    Py_buffer src, out;
    if (!PyArg_ParseTuple(args, "y*w*", &src, &out))
        return NULL;
    PyObject *result = NULL;
    if (!rgb_len(&src, "src"))
        goto done;
    if (out.len != 768 * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_Format(PyExc_ValueError, "out: expected 768 int64 (%zd bytes), got %zd bytes",
                     768 * (Py_ssize_t)sizeof(int64_t), out.len);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    const uint8_t *s = src.buf;
    int64_t *h = out.buf;
    memset(h, 0, 768 * sizeof(int64_t));
    for (Py_ssize_t i = 0; i < src.len; i += 3) {
        h[s[i]]++;
        h[256 + s[i + 1]]++;
        h[512 + s[i + 2]]++;
    }
    Py_END_ALLOW_THREADS;
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *luma_sum(PyObject *self, PyObject *arg) {
    Py_buffer src;
    if (PyObject_GetBuffer(arg, &src, PyBUF_SIMPLE) < 0)
        return NULL;
    if (!rgb_len(&src, "src")) {
        PyBuffer_Release(&src);
        return NULL;
    }
    long long total = 0;
    Py_BEGIN_ALLOW_THREADS;
    total = luma_total(src.buf, src.len);
    Py_END_ALLOW_THREADS;
    PyBuffer_Release(&src);
    return PyLong_FromLongLong(total);
}

/* the three blends: a degenerate row (built per row into a scratch buffer) blended with the source row */
enum degenerate { DEG_CONST, DEG_GRAY, DEG_SMOOTH };

static int blend_image(const uint8_t *src, uint8_t *dst, Py_ssize_t w, Py_ssize_t h, enum degenerate kind,
                       int value, float a) {
    Py_ssize_t n = 3 * w;
    uint8_t *deg = malloc(n > 0 ? n : 1);
    if (!deg)
        return 0;
    if (kind == DEG_CONST)
        memset(deg, value, n);
    for (Py_ssize_t y = 0; y < h; y++) {
        const uint8_t *row = src + y * n;
        if (kind == DEG_GRAY) {
            gray_row(row, deg, n);
        } else if (kind == DEG_SMOOTH) {
            /* Filter.c copies the first and last rows and the first and last pixel of each row, and
             * returns a plain copy for images under 3x3 */
            if (y == 0 || y == h - 1 || w < 3 || h < 3) {
                memcpy(deg, row, n);
            } else {
                memcpy(deg, row, 3);
                memcpy(deg + n - 3, row + n - 3, 3);
                smooth_row(row - n, row, row + n, deg, n);
            }
        }
        blend_row(deg, row, dst + y * n, n, a);
    }
    free(deg);
    return 1;
}

static PyObject *run_blend(Py_buffer *src, Py_buffer *dst, Py_ssize_t w, Py_ssize_t h, enum degenerate kind,
                           int value, double alpha) {
    PyObject *result = NULL;
    int ok = 0;
    if (!same_len(src, dst))
        goto done;
    if (w < 0 || h < 0 || w * h * 3 != src->len) {
        PyErr_Format(PyExc_ValueError, "a %zd x %zd RGB image is not %zd bytes", w, h, src->len);
        goto done;
    }
    if (src->buf == dst->buf && src->len > 0) {
        PyErr_SetString(PyExc_ValueError, "dst must not be src");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    ok = blend_image(src->buf, dst->buf, w, h, kind, value, (float)alpha);
    Py_END_ALLOW_THREADS;
    if (!ok) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(src);
    PyBuffer_Release(dst);
    return result;
}

static PyObject *blend_const(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    int value;
    double alpha;
    if (!PyArg_ParseTuple(args, "y*w*id", &src, &dst, &value, &alpha))
        return NULL;
    if (value < 0 || value > 255) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        return PyErr_Format(PyExc_ValueError, "value: expected 0..255, got %d", value);
    }
    return run_blend(&src, &dst, src.len / 3, 1, DEG_CONST, value, alpha);
}

static PyObject *blend_gray(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    double alpha;
    if (!PyArg_ParseTuple(args, "y*w*d", &src, &dst, &alpha))
        return NULL;
    return run_blend(&src, &dst, src.len / 3, 1, DEG_GRAY, 0, alpha);
}

static PyObject *blend_smooth(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    Py_ssize_t w, h;
    double alpha;
    if (!PyArg_ParseTuple(args, "y*w*nnd", &src, &dst, &w, &h, &alpha))
        return NULL;
    return run_blend(&src, &dst, w, h, DEG_SMOOTH, 0, alpha);
}

static PyMethodDef methods[] = {
    {"lut", lut, METH_VARARGS, "lut(src, dst, table): dst = src through a 768-byte per-channel table."},
    {"minmax", minmax, METH_O, "minmax(src) -> (lo_r, lo_g, lo_b, hi_r, hi_g, hi_b)."},
    {"histogram", histogram, METH_VARARGS, "histogram(src, out): per-channel counts into 768 int64."},
    {"luma_sum", luma_sum, METH_O, "luma_sum(src) -> int: the sum of Pillow's convert('L') over the pixels."},
    {"blend_const", blend_const, METH_VARARGS, "blend_const(src, dst, value, alpha): Image.blend(constant, src, alpha)."},
    {"blend_gray", blend_gray, METH_VARARGS, "blend_gray(src, dst, alpha): Image.blend(grayscale of src, src, alpha)."},
    {"blend_smooth", blend_smooth, METH_VARARGS,
     "blend_smooth(src, dst, width, height, alpha): Image.blend(src.filter(SMOOTH), src, alpha)."},
    VECTOR_LEVEL_METHODS,
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_colorops", NULL, -1, methods};

PyMODINIT_FUNC PyInit__colorops(void) {
#ifdef HAVE_AVX2_VARIANT
    vector_level_init();
    init_masks();
#endif
    return PyModule_Create(&module);
}
