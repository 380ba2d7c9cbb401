/* Pillow's antialiased resize of an RGB image (bilinear or bicubic), with Pillow's exact arithmetic.
 *
 * resample(src, dst, x0, y0, x1, y1, filter, vertical_first_rule=True, full_w=0, full_h=0, off_x=0, off_y=0)
 *
 * dst (oh x ow x 3 uint8) receives Image.fromarray(src).resize((ow, oh), filter, box=(x0, y0, x1, y1))
 * byte for byte: src and dst are HxWx3 uint8 arrays whose rows may be strided (numpy views), filter
 * 2 is bilinear, 3 bicubic (Pillow's Resampling values). timm's RandomResizedCrop is torchvision's
 * resized_crop, i.e. Pillow's crop then resize: pass the crop as src and box (0, 0, w, h).
 * vertical_first_rule: Pillow 13 runs the vertical pass first when the image loses more than twice as
 * many rows as columns (Pillow #9549); earlier versions always start horizontally. The order changes
 * some bytes (each pass rounds to uint8), so the caller passes what its Pillow does.
 * full_w/full_h/off_x/off_y: dst is the window at (off_x, off_y) of a full_w x full_h resize, i.e.
 * resize((full_w, full_h), box=...).crop((off_x, off_y, off_x + ow, off_y + oh)): timm's eval resize
 * then centre crop, without computing the pixels the crop drops.
 *
 * Pillow (Resample.c) computes per output pixel a window of source pixels and double-precision
 * filter weights stretched by the shrink factor, rounds them to 22-bit fixed point, and runs a
 * horizontal pass (rounded to uint8) over the rows the vertical pass needs, then the vertical pass
 * (or the other way round, see vertical_first_rule).
 * Here the weights come from the same double arithmetic (built without FP contraction, like Pillow's
 * x86-64 build) and the passes do the same integer sums, so the bytes are Pillow's; with AVX2 the
 * horizontal pass does two output pixels (3 channels + 1 unused lane each) per vector and the vertical
 * pass 16 bytes, adding zero-weight taps where windows are padded to one length (exact: integer sums).
 *
 * Why: Pillow's own resize of a typical crop to 224 px costs about as much as the rest of a training
 * transform, and the alternative, a 3-tap prefilter + OpenCV resize, only approximates Pillow's filter
 * (mean error up to 2 levels); `python bench/profiles.py resize DATA` times all three. The GIL is
 * released while it runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HAVE_AVX2_VARIANT 1
#endif

#define PRECISION_BITS (32 - 8 - 2)
#define HALF (1 << (PRECISION_BITS - 1))

static double bilinear_filter(double x) {
    if (x < 0.0)
        x = -x;
    if (x < 1.0)
        return 1.0 - x;
    return 0.0;
}

static double bicubic_filter(double x) {
#define a -0.5
    if (x < 0.0)
        x = -x;
    if (x < 1.0)
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0)
        return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
#undef a
}

static inline uint8_t clip8(int v) {
    v >>= PRECISION_BITS; /* arithmetic shift, as Pillow's table lookup by v >> 22 */
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* One axis: for each output index, the first source index, the tap count and the fixed-point weights
 * (row `i` at k + i * stride). With `uniform` every window is widened to the longest one (shifted
 * left where it would pass the end), its extra taps weighted 0, so vector code can run one length. */
typedef struct {
    int n, stride, taps; /* taps: the longest window */
    int *start, *count;
    int32_t *k;
} Axis;

static void axis_free(Axis *ax) {
    free(ax->start);
    free(ax->count);
    free(ax->k);
    ax->start = ax->count = NULL;
    ax->k = NULL;
}

/* Pillow's precompute_coeffs + normalize_coeffs_8bpc for in_size source pixels, box [in0, in1), out_size
 * outputs, of which the n from `off` on are kept. in0/in1 are floats in Pillow's signature, so the box
 * arrives rounded to float there too. */
static int axis_build(Axis *ax, int in_size, float in0, float in1, int out_size, int off, int n, int filter,
                      int uniform) {
    double (*fn)(double) = filter == 3 ? bicubic_filter : bilinear_filter;
    double support, scale, filterscale;
    filterscale = scale = (double)(in1 - in0) / out_size;
    if (filterscale < 1.0)
        filterscale = 1.0;
    support = (filter == 3 ? 2.0 : 1.0) * filterscale;
    int ksize = (int)ceil(support) * 2 + 1;
    memset(ax, 0, sizeof(*ax));
    double *w = malloc(sizeof(double) * ksize);
    int32_t *kk = malloc(sizeof(int32_t) * (size_t)ksize * n);
    ax->start = malloc(sizeof(int) * n);
    ax->count = malloc(sizeof(int) * n);
    if (!w || !kk || !ax->start || !ax->count) {
        free(w);
        free(kk);
        axis_free(ax);
        return -1;
    }
    int taps = 1;
    for (int xx = 0; xx < n; xx++) {
        double center = in0 + (xx + off + 0.5) * scale;
        double ww = 0.0;
        double ss = 1.0 / filterscale;
        int xmin = (int)(center - support + 0.5);
        if (xmin < 0)
            xmin = 0;
        int xmax = (int)(center + support + 0.5);
        if (xmax > in_size)
            xmax = in_size;
        xmax -= xmin;
        if (xmax < 0)
            xmax = 0;
        for (int x = 0; x < xmax; x++) {
            w[x] = fn((x + xmin - center + 0.5) * ss);
            ww += w[x];
        }
        int32_t *k = kk + (size_t)xx * ksize;
        for (int x = 0; x < xmax; x++) {
            double v = ww != 0.0 ? w[x] / ww : w[x];
            k[x] = v < 0 ? (int)(-0.5 + v * (1 << PRECISION_BITS)) : (int)(0.5 + v * (1 << PRECISION_BITS));
        }
        ax->start[xx] = xmin;
        ax->count[xx] = xmax;
        if (xmax > taps)
            taps = xmax;
    }
    free(w);
    ax->n = n;
    ax->taps = taps;
    if (!uniform) {
        ax->k = kk;
        ax->stride = ksize;
        return 0;
    }
    ax->stride = taps;
    ax->k = calloc((size_t)taps * n, sizeof(int32_t));
    if (!ax->k) {
        free(kk);
        axis_free(ax);
        return -1;
    }
    for (int xx = 0; xx < n; xx++) {
        int s = ax->start[xx] < in_size - taps ? ax->start[xx] : in_size - taps;
        memcpy(ax->k + (size_t)xx * taps + (ax->start[xx] - s), kk + (size_t)xx * ksize,
               sizeof(int32_t) * ax->count[xx]);
        ax->start[xx] = s;
        ax->count[xx] = taps;
    }
    free(kk);
    return 0;
}

typedef struct {
    uint8_t *p;
    Py_ssize_t stride; /* bytes between rows */
    int w, h;
} Plane;

/* Output pixel xx of a row: Pillow's three channel sums over the pixel's window of source row s. */
static inline void pixel_scalar(const uint8_t *s, const Axis *ax, int xx, uint8_t *d) {
    const int32_t *k = ax->k + (size_t)xx * ax->stride;
    const uint8_t *p = s + ax->start[xx] * 3;
    int s0 = HALF, s1 = HALF, s2 = HALF;
    for (int x = 0; x < ax->count[xx]; x++) {
        s0 += p[3 * x + 0] * k[x];
        s1 += p[3 * x + 1] * k[x];
        s2 += p[3 * x + 2] * k[x];
    }
    d[3 * xx + 0] = clip8(s0);
    d[3 * xx + 1] = clip8(s1);
    d[3 * xx + 2] = clip8(s2);
}

/* Horizontal pass: rows [row0, row0 + rows) of src -> rows [0, rows) of dst (ax->n pixels wide). */
static void horizontal_scalar(const Plane *src, int row0, int rows, const Plane *dst, const Axis *ax) {
    for (int r = 0; r < rows; r++) {
        const uint8_t *s = src->p + (row0 + r) * src->stride;
        uint8_t *d = dst->p + r * dst->stride;
        for (int xx = 0; xx < ax->n; xx++)
            pixel_scalar(s, ax, xx, d);
    }
}

/* Vertical pass: dst row yy = weighted rows [start, start + count) of src, every byte of the row. */
/* Bytes [from, to) of one output row: Pillow's sum down the n source rows from s (stride apart). */
static inline void row_scalar(const uint8_t *s, Py_ssize_t stride, const int32_t *k, int n, uint8_t *d, int from,
                              int to) {
    for (int x = from; x < to; x++) {
        int acc = HALF;
        for (int y = 0; y < n; y++)
            acc += s[y * stride + x] * k[y];
        d[x] = clip8(acc);
    }
}

static void vertical_scalar(const Plane *src, const Plane *dst, const Axis *ay) {
    for (int yy = 0; yy < ay->n; yy++)
        row_scalar(src->p + ay->start[yy] * src->stride, src->stride, ay->k + (size_t)yy * ay->stride,
                   ay->count[yy], dst->p + yy * dst->stride, 0, dst->w * 3);
}

#ifdef HAVE_AVX2_VARIANT
/* Two output pixels per vector, two taps per 16-bit multiply-add. Each 22-bit weight is split into
 * k = hi * 2^11 + lo (lo in [0, 2^11)), so pixel x weight products fit vpmaddwd's 16-bit inputs and
 * the sum (hi-sum << 11) + lo-sum is Pillow's 32-bit sum exactly. A pixel's taps are read 12 bytes
 * (4 taps) at a time with 16-byte loads and spread into (tap t, tap t+1) 16-bit pairs per channel by a
 * byte shuffle. Needs ax built `uniform` and weights from `split_weights`. The loads reach up to 15
 * bytes past a window: the caller keeps the source's last row on the scalar path and its rows >= 16
 * bytes long (temporary buffers carry 16 bytes of slack). */
typedef struct {
    __m256i lo, hi;
} WeightPair;

static int split_weights(const Axis *ax, WeightPair **out) {
    int pairs = ax->n / 2, tp = (ax->taps + 1) / 2;
    WeightPair *w = aligned_alloc(32, sizeof(WeightPair) * ((size_t)pairs * tp + 1));
    if (!w)
        return -1;
    for (int pr = 0; pr < pairs; pr++)
        for (int q = 0; q < tp; q++) {
            int16_t lo[16], hi[16];
            for (int half = 0; half < 2; half++) {
                const int32_t *k = ax->k + (size_t)(2 * pr + half) * ax->stride;
                for (int lane = 0; lane < 8; lane++) {
                    int t = 2 * q + (lane & 1);
                    int32_t v = t < ax->taps ? k[t] : 0;
                    int32_t h = v >> 11; /* floor: lo = v - h * 2^11 stays in [0, 2^11) */
                    lo[half * 8 + lane] = (int16_t)(v - h * 2048);
                    hi[half * 8 + lane] = (int16_t)h;
                }
            }
            memcpy(&w[(size_t)pr * tp + q].lo, lo, 32);
            memcpy(&w[(size_t)pr * tp + q].hi, hi, 32);
        }
    *out = w;
    return 0;
}

/* Pillow's sums of output pixels 2 pr (lanes 0-3) and 2 pr + 1 (lanes 4-7), shifted down to 8 bits. */
static inline __attribute__((target("avx2"), always_inline)) __m256i pair_sum(const uint8_t *s, const Axis *ax, const WeightPair *w,
                                                               int pr, int tp, const __m256i spread[2]) {
    const uint8_t *pa = s + ax->start[2 * pr] * 3, *pb = s + ax->start[2 * pr + 1] * 3;
    const WeightPair *k = w + (size_t)pr * tp;
    __m256i acc_lo = _mm256_setzero_si256(), acc_hi = acc_lo, px = acc_lo;
#pragma GCC unroll 4
    for (int q = 0; q < tp; q++) {
        if ((q & 1) == 0) /* the next 4 taps of both pixels */
            px = _mm256_loadu2_m128i((const __m128i *)(pb + 6 * q), (const __m128i *)(pa + 6 * q));
        __m256i v = _mm256_shuffle_epi8(px, spread[q & 1]);
        acc_lo = _mm256_add_epi32(acc_lo, _mm256_madd_epi16(v, k[q].lo));
        acc_hi = _mm256_add_epi32(acc_hi, _mm256_madd_epi16(v, k[q].hi));
    }
    __m256i acc = _mm256_add_epi32(_mm256_slli_epi32(acc_hi, 11), acc_lo);
    return _mm256_srai_epi32(_mm256_add_epi32(acc, _mm256_set1_epi32(HALF)), PRECISION_BITS);
}

/* `tp` (tap pairs) as a compile-time constant where it is one, so the tap loop unrolls */
static inline __attribute__((target("avx2"), always_inline)) void horizontal_rows(
    const Plane *src, int row0, int rows, const Plane *dst, const Axis *ax, const WeightPair *w, const int tp) {
    const int pairs = ax->n / 2;
    /* (tap 2j, tap 2j+1) of R, G, B as 16-bit pairs, from bytes 6j..6j+5 of a 12-byte group */
    const __m256i spread[2] = {
        _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1,
                         0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1),
        _mm256_setr_epi8(6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1,
                         6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1),
    };
    /* RGBx words -> packed RGB: 2 pixels of a pair, or 4 pixels per 128-bit lane */
    const __m128i pick6 = _mm_setr_epi8(0, 1, 2, 4, 5, 6, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i pick12 = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
                                            0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int r = 0; r < rows; r++) {
        const uint8_t *s = src->p + (row0 + r) * src->stride;
        uint8_t *d = dst->p + r * dst->stride;
        int pr = 0;
        for (; pr + 4 <= pairs; pr += 4) { /* 8 pixels, one 24-byte write */
            __m256i a0 = pair_sum(s, ax, w, pr, tp, spread), a1 = pair_sum(s, ax, w, pr + 1, tp, spread);
            __m256i a2 = pair_sum(s, ax, w, pr + 2, tp, spread), a3 = pair_sum(s, ax, w, pr + 3, tp, spread);
            /* packs/packus work per 128-bit lane: pixels 0 2 4 6 | 1 3 5 7, then put in order */
            __m256i u = _mm256_packus_epi16(_mm256_packs_epi32(a0, a1), _mm256_packs_epi32(a2, a3));
            u = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(u, order), pick12);
            __m128i hi = _mm256_extracti128_si256(u, 1);
            _mm_storeu_si128((__m128i *)(d + 6 * pr), _mm256_castsi256_si128(u)); /* 4 spare bytes, overwritten: */
            _mm_storel_epi64((__m128i *)(d + 6 * pr + 12), hi);
            uint32_t tail = (uint32_t)_mm_extract_epi32(hi, 2);
            memcpy(d + 6 * pr + 20, &tail, 4);
        }
        for (; pr < pairs; pr++) {
            __m256i acc = pair_sum(s, ax, w, pr, tp, spread);
            __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
            __m128i b = _mm_shuffle_epi8(_mm_packus_epi16(w16, w16), pick6);
            uint64_t six = (uint64_t)_mm_cvtsi128_si64(b);
            memcpy(d + 6 * pr, &six, 6);
        }
        if (ax->n & 1) /* the odd last pixel */
            pixel_scalar(s, ax, ax->n - 1, d);
    }
}

__attribute__((target("avx2"))) static void horizontal_avx2(const Plane *src, int row0, int rows,
                                                             const Plane *dst, const Axis *ax, const WeightPair *w) {
    switch ((ax->taps + 1) / 2) {
    case 1:
        horizontal_rows(src, row0, rows, dst, ax, w, 1);
        break;
    case 2:
        horizontal_rows(src, row0, rows, dst, ax, w, 2);
        break;
    case 3:
        horizontal_rows(src, row0, rows, dst, ax, w, 3);
        break;
    case 4:
        horizontal_rows(src, row0, rows, dst, ax, w, 4);
        break;
    default:
        horizontal_rows(src, row0, rows, dst, ax, w, (ax->taps + 1) / 2);
    }
}

static inline __attribute__((target("avx2"))) __m128i pack8(__m256i acc) {
    acc = _mm256_srai_epi32(acc, PRECISION_BITS);
    __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    return _mm_packus_epi16(w16, w16);
}

/* Bytes [x, bytes) of one output row: 16 per step, then 8, then the scalar tail. Reads exactly the bytes
 * it writes. */
__attribute__((target("avx2"))) static void vertical_row_avx2(const uint8_t *s, Py_ssize_t stride, const int32_t *k,
                                                               int n, uint8_t *d, int x, int bytes) {
    int vec_end = bytes & ~7;
    for (; x + 16 <= bytes; x += 16) {
        __m256i a0 = _mm256_set1_epi32(HALF), a1 = a0;
        for (int y = 0; y < n; y++) {
            const uint8_t *row = s + y * stride + x;
            __m256i kv = _mm256_set1_epi32(k[y]);
            a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)row)), kv));
            a1 = _mm256_add_epi32(a1, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + 8))), kv));
        }
        _mm_storeu_si128((__m128i *)(d + x), _mm_unpacklo_epi64(pack8(a0), pack8(a1)));
    }
    for (; x < vec_end; x += 8) {
        __m256i a0 = _mm256_set1_epi32(HALF);
        for (int y = 0; y < n; y++) {
            const uint8_t *row = s + y * stride + x;
            a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)row)),
                                                         _mm256_set1_epi32(k[y])));
        }
        _mm_storel_epi64((__m128i *)(d + x), pack8(a0));
    }
    row_scalar(s, stride, k, n, d, x, bytes);
}

__attribute__((target("avx2"))) static void vertical_avx2(const Plane *src, const Plane *dst, const Axis *ay) {
    for (int yy = 0; yy < ay->n; yy++)
        vertical_row_avx2(src->p + ay->start[yy] * src->stride, src->stride, ay->k + (size_t)yy * ay->stride,
                          ay->count[yy], dst->p + yy * dst->stride, 0, dst->w * 3);
}

/* The vertical pass with AVX-512 (where the CPU has it): 32 bytes per step, the same integer sums, so
 * the same bytes, faster than the AVX2 pass. (A horizontal pass with four pixels per vector was no
 * faster: its loads and byte shuffles all go to one execution port, as the AVX2 pass's do.) */
#define AVX512 __attribute__((target("avx2,avx512f,avx512vl,avx512bw,avx512dq")))

/* 16 int32 sums -> 16 bytes clamped to [0, 255], as pack8's two saturating packs */
static inline AVX512 __attribute__((always_inline)) __m128i clamp_bytes(__m512i v) {
    return _mm512_cvtusepi32_epi8(_mm512_max_epi32(v, _mm512_setzero_si512()));
}

/* 32 bytes of a row per step; the rest of the row with AVX2 */
AVX512 static void vertical_avx512(const Plane *src, const Plane *dst, const Axis *ay) {
    int bytes = dst->w * 3;
    for (int yy = 0; yy < ay->n; yy++) {
        const int32_t *k = ay->k + (size_t)yy * ay->stride;
        const uint8_t *s = src->p + ay->start[yy] * src->stride;
        uint8_t *d = dst->p + yy * dst->stride;
        int n = ay->count[yy], x = 0;
        for (; x + 32 <= bytes; x += 32) {
            __m512i a0 = _mm512_set1_epi32(HALF), a1 = a0;
            for (int y = 0; y < n; y++) {
                const uint8_t *row = s + y * src->stride + x;
                __m512i kv = _mm512_set1_epi32(k[y]);
                a0 = _mm512_add_epi32(a0, _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)row)), kv));
                a1 = _mm512_add_epi32(a1, _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + 16))), kv));
            }
            _mm_storeu_si128((__m128i *)(d + x), clamp_bytes(_mm512_srai_epi32(a0, PRECISION_BITS)));
            _mm_storeu_si128((__m128i *)(d + x + 16), clamp_bytes(_mm512_srai_epi32(a1, PRECISION_BITS)));
        }
        vertical_row_avx2(s, src->stride, k, n, d, x, bytes);
    }
}
#endif

#include "_vector_level.h"

/* The horizontal pass over rows [row0, row0 + rows) of src into dst, vectorised where it can be.
 * `last_row_unsafe`: the byte after src's last row may lie outside the array (see horizontal_avx2). */
static int horizontal(const Plane *src, int row0, int rows, const Plane *dst, const Axis *ax, int vector,
                      int last_row_unsafe) {
#ifdef HAVE_AVX2_VARIANT
    if (vector && src->w >= 6) { /* rows of >= 16 bytes: a load's overrun stays in the next row */
        WeightPair *w;
        if (split_weights(ax, &w) < 0)
            return -1;
        int safe = rows - (last_row_unsafe && row0 + rows == src->h);
        horizontal_avx2(src, row0, safe, dst, ax, w);
        Plane rest = *dst;
        rest.p = dst->p + safe * dst->stride;
        horizontal_scalar(src, row0 + safe, rows - safe, &rest, ax);
        free(w);
        return 0;
    }
#endif
    horizontal_scalar(src, row0, rows, dst, ax);
    return 0;
}

static void vertical(const Plane *src, const Plane *dst, const Axis *ay, int vector) {
#ifdef HAVE_AVX2_VARIANT
    if (vector && use_avx512) {
        vertical_avx512(src, dst, ay);
        return;
    }
    if (vector) {
        vertical_avx2(src, dst, ay);
        return;
    }
#endif
    vertical_scalar(src, dst, ay);
}

/* Pillow's ImagingResampleInner for RGB, resizing to full_w x full_h and keeping the dst-sized window
 * at (off_x, off_y). The two passes run horizontal first, except (with `vertical_first_rule`, Pillow
 * >= 13) when the image loses more than twice as many rows as columns. A pass Pillow skips (that axis
 * keeps its size and box) has weights of exactly 1 and 0 here, so running it for a window is exact.
 * Returns 0, or -1 when out of memory. */
static int resample_rgb(const Plane *src, const Plane *dst, const float box[4], int filter, int vertical_first_rule,
                        int full_w, int full_h, int off_x, int off_y) {
    int need_h = full_w != src->w || box[0] != 0 || box[2] != full_w || off_x || dst->w != full_w;
    int need_v = full_h != src->h || box[1] != 0 || box[3] != full_h || off_y || dst->h != full_h;
    int vector = use_avx2;
    Axis ax = {0}, ay = {0};
    uint8_t *tmp = NULL;
    int rc = -1;
    if (axis_build(&ay, src->h, box[1], box[3], full_h, off_y, dst->h, filter, 0) < 0)
        goto done;
    if (need_h && axis_build(&ax, src->w, box[0], box[2], full_w, off_x, dst->w, filter, vector) < 0)
        goto done;
    if (need_h && need_v) {
        int v_first = vertical_first_rule && full_h < src->h && src->h - full_h > 2 * (src->w - full_w);
        Plane mid; /* the first pass's result, kept only where the second pass reads */
        if (!v_first) {
            int first = ay.start[0], last = ay.start[ay.n - 1] + ay.count[ay.n - 1];
            mid = (Plane){NULL, (Py_ssize_t)dst->w * 3, dst->w, last - first};
            tmp = malloc((size_t)mid.stride * mid.h + 16);
            if (!tmp)
                goto done;
            mid.p = tmp;
            for (int i = 0; i < ay.n; i++)
                ay.start[i] -= first;
            if (horizontal(src, first, mid.h, &mid, &ax, vector, 1) < 0)
                goto done;
            vertical(&mid, dst, &ay, vector);
        } else {
            int first = src->w, last = 0;
            for (int i = 0; i < ax.n; i++) {
                if (ax.start[i] < first)
                    first = ax.start[i];
                if (ax.start[i] + ax.count[i] > last)
                    last = ax.start[i] + ax.count[i];
            }
            Plane cols = {src->p + first * 3, src->stride, last - first, src->h};
            mid = (Plane){NULL, (Py_ssize_t)(last - first) * 3, last - first, dst->h};
            tmp = malloc((size_t)mid.stride * mid.h + 16); /* the vector pass reads up to 15 bytes past a row */
            if (!tmp)
                goto done;
            mid.p = tmp;
            vertical(&cols, &mid, &ay, vector);
            for (int i = 0; i < ax.n; i++)
                ax.start[i] -= first;
            if (horizontal(&mid, 0, mid.h, dst, &ax, vector, 0) < 0)
                goto done;
        }
    } else if (need_h) {
        if (horizontal(src, 0, src->h, dst, &ax, vector, 1) < 0)
            goto done;
    } else if (need_v) {
        vertical(src, dst, &ay, vector);
    } else {
        for (int y = 0; y < dst->h; y++)
            memcpy(dst->p + y * dst->stride, src->p + y * src->stride, (size_t)dst->w * 3);
    }
    rc = 0;
done:
    axis_free(&ax);
    axis_free(&ay);
    free(tmp);
    return rc;
}

/* An HxWx3 uint8 array whose pixels are packed (rows may be strided), as a Plane; NULL + error if not. */
static int get_plane(PyObject *obj, Py_buffer *view, int writable, Plane *pl, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    const char *fmt = view->format ? view->format : "B";
    if (view->ndim != 3 || view->shape[2] != 3 || view->itemsize != 1 || (strcmp(fmt, "B") && strcmp(fmt, "=B")) ||
        view->strides[2] != 1 || view->strides[1] != 3 || view->shape[0] < 1 || view->shape[1] < 1 ||
        view->strides[0] < view->shape[1] * 3 || view->shape[0] > INT_MAX / 4 || view->shape[1] > INT_MAX / 4) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "resample: %s must be a non-empty HxWx3 uint8 array with packed pixels", name);
        return -1;
    }
    pl->p = view->buf;
    pl->stride = view->strides[0];
    pl->h = (int)view->shape[0];
    pl->w = (int)view->shape[1];
    return 0;
}

static PyObject *resample(PyObject *self, PyObject *args) {
    PyObject *src_obj, *dst_obj;
    double b[4];
    int filter, vertical_first_rule = 1, full_w = 0, full_h = 0, off_x = 0, off_y = 0;
    if (!PyArg_ParseTuple(args, "OOddddi|piiii", &src_obj, &dst_obj, &b[0], &b[1], &b[2], &b[3], &filter,
                          &vertical_first_rule, &full_w, &full_h, &off_x, &off_y))
        return NULL;
    if (filter != 2 && filter != 3) {
        PyErr_SetString(PyExc_ValueError, "resample: filter must be 2 (bilinear) or 3 (bicubic)");
        return NULL;
    }
    Py_buffer sv, dv;
    Plane src, dst;
    if (get_plane(src_obj, &sv, 0, &src, "src") < 0)
        return NULL;
    if (get_plane(dst_obj, &dv, 1, &dst, "dst") < 0) {
        PyBuffer_Release(&sv);
        return NULL;
    }
    float box[4] = {(float)b[0], (float)b[1], (float)b[2], (float)b[3]};
    const char *problem = NULL;
    for (int i = 0; i < 4; i++)
        if (!isfinite(b[i]))
            problem = "the box must be finite";
    if (!problem && (box[0] < 0 || box[1] < 0 || box[2] > src.w || box[3] > src.h))
        problem = "the box must lie inside src"; /* Pillow: "Box can't exceed original image size" */
    else if (!problem && (box[2] - box[0] <= 0 || box[3] - box[1] <= 0))
        problem = "the box must not be empty";
    if (full_w == 0 && full_h == 0 && off_x == 0 && off_y == 0)
        full_w = dst.w, full_h = dst.h; /* no window: the whole resize */
    if (!problem && (off_x < 0 || off_y < 0 || full_w - off_x < dst.w || full_h - off_y < dst.h))
        problem = "the window (off_x, off_y) + dst's size must lie inside (full_w, full_h)";
    int rc = 0;
    if (!problem) {
        Py_BEGIN_ALLOW_THREADS
        rc = resample_rgb(&src, &dst, box, filter, vertical_first_rule, full_w, full_h, off_x, off_y);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&sv);
    PyBuffer_Release(&dv);
    if (problem) {
        PyErr_Format(PyExc_ValueError, "resample: %s", problem);
        return NULL;
    }
    if (rc < 0)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"resample", resample, METH_VARARGS,
     "resample(src, dst, x0, y0, x1, y1, filter, vertical_first_rule=True, full_w=0, full_h=0, off_x=0, off_y=0): "
     "dst = Pillow's resize of the RGB uint8 array src to dst's size (or the window of a full_w x full_h resize "
     "at off_x, off_y), box (x0, y0, x1, y1), filter 2 (bilinear) or 3 (bicubic); the same bytes as Pillow "
     "(vertical_first_rule: Pillow >= 13's choice of the first pass). ValueError "
     "on arrays that are not HxWx3 uint8 with packed pixels, or a box outside src."},
    VECTOR_LEVEL_METHODS,
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_resample", NULL, -1, methods};

PyMODINIT_FUNC PyInit__resample(void) {
    vector_level_init();
    return PyModule_Create(&module);
}
