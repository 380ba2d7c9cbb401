/* Pillow's affine transform of an RGB image with bilinear or bicubic sampling, as a tight loop.
 *
 * affine_rgb(src, src_w, src_h, dst, dst_w, dst_h, a0, a1, a2, a3, a4, a5, filter, fill) -> None
 *
 * Output pixel (x, y) samples the source at (a0 (x+.5) + a1 (y+.5) + a2, a3 (x+.5) + a4 (y+.5) + a5),
 * exactly as Pillow's Image.transform(size, AFFINE, a, resample) does for mode RGB (Geometry.c:
 * affine_transform, bilinear_filter32RGB, bicubic_filter32RGB in ImagingGenericTransform): the same
 * double arithmetic in the same order, the same edge clamping, truncation (bilinear) or
 * clamp-then-truncate (bicubic) to uint8, and `fill` (3 bytes) where the point falls outside the
 * source. filter 2 is bilinear, 3 bicubic (Pillow's Resampling values). src and dst are packed
 * HxWx3 uint8.
 *
 * Why: timm's RandAugment/AutoAugment geometric ops (rotate, shear, translate) go through Pillow's
 * generic transform engine, about a millisecond (bilinear) to 2.5 (bicubic) per 224 px image, the
 * largest cost of rand-m9. The per-pixel double arithmetic is the cost, not Pillow's per-pixel calls
 * (the same loop in plain C is barely faster), so both filters run four pixels per AVX2 vector where
 * the CPU has it, about twice as fast (`python bench/profiles.py autoaug` times each): every lane performs the same IEEE operations as the scalar code, so the bytes stay
 * Pillow's (tests compare against Pillow on random matrices and whole policies). Built without FP
 * contraction, like Pillow's x86-64 build; the GIL is released during the loop.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HAVE_AVX2_VARIANT 1
#endif

#define FLOOR(v) ((v) < 0.0 ? ((int)floor(v)) : ((int)(v)))
#define CLIP(v, n) (((v) < 0) ? 0 : ((v) < (n)) ? (v) : (n)-1)

typedef struct {
    const uint8_t *src;
    Py_ssize_t len; /* bytes readable at src */
    int w, h;
} Source;

/* Pillow's BILINEAR_HEAD / BICUBIC_HEAD: 0 when (xin, yin) is outside the source, else the pixel-centre
 * position's floor (x, y) and fractions (dx, dy). */
static inline int locate(const Source *s, double xin, double yin, int *x, int *y, double *dx, double *dy) {
    if (xin < 0.0 || xin >= s->w || yin < 0.0 || yin >= s->h)
        return 0;
    xin -= 0.5;
    yin -= 0.5;
    *x = FLOOR(xin);
    *y = FLOOR(yin);
    *dx = xin - *x;
    *dy = yin - *y;
    return 1;
}

/* Pillow's BILINEAR_BODY for one pixel, all three bands; 0 if outside. */
static inline int bilinear(const Source *s, double xin, double yin, uint8_t *out) {
    int x, y;
    double dx, dy;
    if (!locate(s, xin, yin, &x, &y, &dx, &dy))
        return 0;
    const uint8_t *r0 = s->src + (size_t)CLIP(y, s->h) * s->w * 3;
    const uint8_t *r1 = (y + 1 >= 0 && y + 1 < s->h) ? s->src + (size_t)(y + 1) * s->w * 3 : NULL;
    int x0 = CLIP(x, s->w) * 3, x1 = CLIP(x + 1, s->w) * 3;
    for (int b = 0; b < 3; b++) {
        double v1 = r0[x0 + b] + (r0[x1 + b] - r0[x0 + b]) * dx;
        double v2 = r1 ? r1[x0 + b] + (r1[x1 + b] - r1[x0 + b]) * dx : v1;
        v1 = v1 + (v2 - v1) * dy;
        out[b] = (uint8_t)v1;
    }
    return 1;
}

/* Pillow's BICUBIC macro: the first (horizontal) pass on ints, the second on doubles. */
#define CUBIC(v, q1, q2, q3, q4, d)                  \
    do {                                             \
        double p1 = q2;                              \
        double p2 = -q1 + q3;                        \
        double p3 = 2 * (q1 - q2) + q3 - q4;         \
        double p4 = -q1 + q2 - q3 + q4;              \
        v = p1 + (d) * (p2 + (d) * (p3 + (d)*p4));   \
    } while (0)

static inline int bicubic(const Source *s, double xin, double yin, uint8_t *out) {
    int x, y;
    double dx, dy;
    if (!locate(s, xin, yin, &x, &y, &dx, &dy))
        return 0;
    x--;
    y--;
    int xs[4];
    for (int i = 0; i < 4; i++)
        xs[i] = CLIP(x + i, s->w) * 3;
    const size_t stride = (size_t)s->w * 3;
    for (int b = 0; b < 3; b++) {
        double v[4];
        const uint8_t *in = s->src + (size_t)CLIP(y, s->h) * stride + b;
        CUBIC(v[0], (int)in[xs[0]], (int)in[xs[1]], (int)in[xs[2]], (int)in[xs[3]], dx);
        for (int k = 1; k < 4; k++) {
            if (y + k >= 0 && y + k < s->h) {
                in = s->src + (size_t)(y + k) * stride + b;
                CUBIC(v[k], (int)in[xs[0]], (int)in[xs[1]], (int)in[xs[2]], (int)in[xs[3]], dx);
            } else {
                v[k] = v[k - 1];
            }
        }
        double r;
        CUBIC(r, v[0], v[1], v[2], v[3], dy);
        out[b] = r <= 0.0 ? 0 : r >= 255.0 ? 255 : (uint8_t)r;
    }
    return 1;
}

/* Pillow's affine_transform: xin = x + 0.5, evaluated left to right. */
static inline void map_point(const double *a, int x, int y, double *xx, double *yy) {
    double xin = x + 0.5, yin = y + 0.5;
    *xx = a[0] * xin + a[1] * yin + a[2];
    *yy = a[3] * xin + a[4] * yin + a[5];
}

/* Output pixels [x0, x1) of row y, written from `o` on, with the scalar filters. */
static void warp_pixels(const Source *s, uint8_t *o, int x0, int x1, int y, const double *a, int filter,
                        const uint8_t *fill) {
    for (int x = x0; x < x1; x++, o += 3) {
        double xx, yy;
        map_point(a, x, y, &xx, &yy);
        if (!(filter == 2 ? bilinear(s, xx, yy, o) : bicubic(s, xx, yy, o)))
            memcpy(o, fill, 3);
    }
}

static void warp_scalar(const Source *s, uint8_t *out, int dw, int dh, const double *a, int filter,
                        const uint8_t *fill) {
    for (int y = 0; y < dh; y++)
        warp_pixels(s, out + (size_t)y * dw * 3, 0, dw, y, a, filter, fill);
}

#ifdef HAVE_AVX2_VARIANT
/* Four output pixels per step: every lane does the scalar code's operations on the same doubles (mul,
 * add, sub, floor and int <-> double conversions round identically), so the bytes are the same. Pixels
 * are gathered as 4-byte RGBx words; lanes outside the source compute on clamped, valid addresses and
 * get the fill. A step whose loads would pass the buffer's end runs the scalar code instead. */
#define AVX2 __attribute__((target("avx2")))

typedef struct {
    __m256d dx, dy;   /* fractional positions */
    __m128i ix, iy;   /* floor of the positions */
} Where;

typedef int (*Step4)(const Source *, const Where *, int res[3][4]); /* 0: a load would pass the end */

/* RGBx word gathers at byte offsets `off`, one band of them as int32 lanes */
AVX2 static inline __m128i band(__m128i word, int b) {
    return _mm_and_si128(_mm_srl_epi32(word, _mm_cvtsi32_si128(8 * b)), _mm_set1_epi32(0xFF));
}

AVX2 static inline __m128i clip4(__m128i v, int n) {
    return _mm_min_epi32(_mm_max_epi32(v, _mm_setzero_si128()), _mm_set1_epi32(n - 1));
}

AVX2 static inline __m128i inside_rows(__m128i y, int h) { /* 0 <= y < h, as lane masks */
    return _mm_andnot_si128(_mm_cmplt_epi32(y, _mm_setzero_si128()), _mm_cmplt_epi32(y, _mm_set1_epi32(h)));
}

AVX2 static inline int past_end(const Source *s, __m128i off) { /* a 4-byte load at off passes the end */
    return _mm_movemask_epi8(_mm_cmpgt_epi32(off, _mm_set1_epi32((int)(s->len - 4)))) != 0;
}

AVX2 static inline __m256d lane_mask(__m128i m) { return _mm256_castsi256_pd(_mm256_cvtepi32_epi64(m)); }

/* BILINEAR_BODY for four pixels, three bands. */
AVX2 static int bilinear4(const Source *s, const Where *p, int res[3][4]) {
    const __m128i w3 = _mm_set1_epi32(s->w * 3), three = _mm_set1_epi32(3), one = _mm_set1_epi32(1);
    __m128i y0 = clip4(p->iy, s->h), iy1 = _mm_add_epi32(p->iy, one), row1 = inside_rows(iy1, s->h);
    __m128i r0 = _mm_mullo_epi32(y0, w3), r1 = _mm_mullo_epi32(_mm_blendv_epi8(y0, iy1, row1), w3);
    __m128i c0 = _mm_mullo_epi32(clip4(p->ix, s->w), three);
    __m128i c1 = _mm_mullo_epi32(clip4(_mm_add_epi32(p->ix, one), s->w), three);
    if (past_end(s, _mm_add_epi32(r0, c1)) || past_end(s, _mm_add_epi32(r1, c1)))
        return 0; /* c1 >= c0 in every lane */
    const int *base = (const int *)s->src;
    __m128i g00 = _mm_i32gather_epi32(base, _mm_add_epi32(r0, c0), 1);
    __m128i g01 = _mm_i32gather_epi32(base, _mm_add_epi32(r0, c1), 1);
    __m128i g10 = _mm_i32gather_epi32(base, _mm_add_epi32(r1, c0), 1);
    __m128i g11 = _mm_i32gather_epi32(base, _mm_add_epi32(r1, c1), 1);
    __m256d use_row1 = lane_mask(row1);
    for (int b = 0; b < 3; b++) {
        __m128i p00 = band(g00, b), p01 = band(g01, b), p10 = band(g10, b), p11 = band(g11, b);
        __m256d v1 = _mm256_add_pd(_mm256_cvtepi32_pd(p00), _mm256_mul_pd(_mm256_cvtepi32_pd(_mm_sub_epi32(p01, p00)), p->dx));
        __m256d v2 = _mm256_add_pd(_mm256_cvtepi32_pd(p10), _mm256_mul_pd(_mm256_cvtepi32_pd(_mm_sub_epi32(p11, p10)), p->dx));
        v2 = _mm256_blendv_pd(v1, v2, use_row1); /* no row below: v2 = v1 */
        __m256d v = _mm256_add_pd(v1, _mm256_mul_pd(_mm256_sub_pd(v2, v1), p->dy));
        _mm_storeu_si128((__m128i *)res[b], _mm256_cvttpd_epi32(v));
    }
    return 1;
}

/* One horizontal cubic pass of Pillow's BICUBIC on four lanes: q1..q4 ints (exact in int32), then
 * p1 + d (p2 + d (p3 + d p4)) in double. */
AVX2 static inline __m256d cubic_ints(__m128i q1, __m128i q2, __m128i q3, __m128i q4, __m256d d) {
    __m128i p2 = _mm_add_epi32(_mm_sub_epi32(_mm_setzero_si128(), q1), q3);
    __m128i p3 = _mm_sub_epi32(_mm_add_epi32(_mm_slli_epi32(_mm_sub_epi32(q1, q2), 1), q3), q4);
    __m128i p4 = _mm_add_epi32(_mm_sub_epi32(_mm_add_epi32(_mm_sub_epi32(_mm_setzero_si128(), q1), q2), q3), q4);
    __m256d inner = _mm256_add_pd(_mm256_cvtepi32_pd(p3), _mm256_mul_pd(d, _mm256_cvtepi32_pd(p4)));
    inner = _mm256_add_pd(_mm256_cvtepi32_pd(p2), _mm256_mul_pd(d, inner));
    return _mm256_add_pd(_mm256_cvtepi32_pd(q2), _mm256_mul_pd(d, inner));
}

/* The vertical pass on doubles, in the scalar macro's order: -v1 + v3, 2 (v1 - v2) + v3 - v4, ... */
AVX2 static inline __m256d cubic_doubles(__m256d v1, __m256d v2, __m256d v3, __m256d v4, __m256d d) {
    const __m256d sign = _mm256_set1_pd(-0.0), two = _mm256_set1_pd(2.0);
    __m256d n1 = _mm256_xor_pd(v1, sign); /* -v1, exactly */
    __m256d p2 = _mm256_add_pd(n1, v3);
    __m256d p3 = _mm256_sub_pd(_mm256_add_pd(_mm256_mul_pd(two, _mm256_sub_pd(v1, v2)), v3), v4);
    __m256d p4 = _mm256_add_pd(_mm256_sub_pd(_mm256_add_pd(n1, v2), v3), v4);
    __m256d inner = _mm256_add_pd(p3, _mm256_mul_pd(d, p4));
    inner = _mm256_add_pd(p2, _mm256_mul_pd(d, inner));
    return _mm256_add_pd(v2, _mm256_mul_pd(d, inner));
}

/* BICUBIC_BODY for four pixels, three bands: 4 rows x 4 columns of gathers. */
AVX2 static int bicubic4(const Source *s, const Where *p, int res[3][4]) {
    const __m128i w3 = _mm_set1_epi32(s->w * 3), three = _mm_set1_epi32(3);
    __m128i x = _mm_sub_epi32(p->ix, _mm_set1_epi32(1)), y = _mm_sub_epi32(p->iy, _mm_set1_epi32(1));
    __m128i col[4], row[4], valid[4];
    for (int k = 0; k < 4; k++)
        col[k] = _mm_mullo_epi32(clip4(_mm_add_epi32(x, _mm_set1_epi32(k)), s->w), three);
    row[0] = _mm_mullo_epi32(clip4(y, s->h), w3);
    for (int k = 1; k < 4; k++) { /* a row outside the image repeats the previous one (below) */
        __m128i yk = _mm_add_epi32(y, _mm_set1_epi32(k));
        valid[k] = inside_rows(yk, s->h);
        row[k] = _mm_blendv_epi8(row[0], _mm_mullo_epi32(yk, w3), valid[k]);
    }
    for (int k = 0; k < 4; k++)
        if (past_end(s, _mm_add_epi32(row[k], col[3]))) /* col[3] is each lane's largest column */
            return 0;
    __m128i g[4][4];
    for (int k = 0; k < 4; k++)
        for (int c = 0; c < 4; c++)
            g[k][c] = _mm_i32gather_epi32((const int *)s->src, _mm_add_epi32(row[k], col[c]), 1);
    for (int b = 0; b < 3; b++) {
        __m256d v[4];
        for (int k = 0; k < 4; k++) {
            v[k] = cubic_ints(band(g[k][0], b), band(g[k][1], b), band(g[k][2], b), band(g[k][3], b), p->dx);
            if (k > 0)
                v[k] = _mm256_blendv_pd(v[k - 1], v[k], lane_mask(valid[k]));
        }
        __m256d r = cubic_doubles(v[0], v[1], v[2], v[3], p->dy);
        r = _mm256_min_pd(_mm256_max_pd(r, _mm256_setzero_pd()), _mm256_set1_pd(255.0)); /* then truncated */
        _mm_storeu_si128((__m128i *)res[b], _mm256_cvttpd_epi32(r));
    }
    return 1;
}

AVX2 static void warp_avx2(const Source *s, uint8_t *out, int dw, int dh, const double *a, int filter,
                           const uint8_t *fill) {
    const Step4 step = filter == 2 ? bilinear4 : bicubic4;
    const __m256d a0 = _mm256_set1_pd(a[0]), a2 = _mm256_set1_pd(a[2]);
    const __m256d a3 = _mm256_set1_pd(a[3]), a5 = _mm256_set1_pd(a[5]);
    const __m256d zero = _mm256_setzero_pd(), half = _mm256_set1_pd(0.5);
    const __m256d wd = _mm256_set1_pd((double)s->w), hd = _mm256_set1_pd((double)s->h);
    for (int y = 0; y < dh; y++) {
        const __m256d yin = _mm256_set1_pd(y + 0.5);
        const __m256d by = _mm256_mul_pd(_mm256_set1_pd(a[1]), yin), ey = _mm256_mul_pd(_mm256_set1_pd(a[4]), yin);
        uint8_t *o = out + (size_t)y * dw * 3;
        int x = 0;
        for (; x + 4 <= dw; x += 4, o += 12) {
            /* affine_transform, left to right: (a0 xin + a1 yin) + a2 */
            __m256d xin = _mm256_setr_pd(x + 0.5, x + 1.5, x + 2.5, x + 3.5);
            __m256d xx = _mm256_add_pd(_mm256_add_pd(_mm256_mul_pd(a0, xin), by), a2);
            __m256d yy = _mm256_add_pd(_mm256_add_pd(_mm256_mul_pd(a3, xin), ey), a5);
            int outside = _mm256_movemask_pd(_mm256_or_pd(
                _mm256_or_pd(_mm256_cmp_pd(xx, zero, _CMP_LT_OQ), _mm256_cmp_pd(xx, wd, _CMP_GE_OQ)),
                _mm256_or_pd(_mm256_cmp_pd(yy, zero, _CMP_LT_OQ), _mm256_cmp_pd(yy, hd, _CMP_GE_OQ))));
            int res[3][4];
            if (outside != 0xF) {
                __m256d xs = _mm256_sub_pd(xx, half), ys = _mm256_sub_pd(yy, half);
                __m256d fx = _mm256_floor_pd(xs), fy = _mm256_floor_pd(ys);
                Where p = {_mm256_sub_pd(xs, fx), _mm256_sub_pd(ys, fy), _mm256_cvttpd_epi32(fx), _mm256_cvttpd_epi32(fy)};
                if (!step(s, &p, res)) {
                    warp_pixels(s, o, x, x + 4, y, a, filter, fill);
                    continue;
                }
            }
            for (int i = 0; i < 4; i++) {
                if (outside & (1 << i)) {
                    memcpy(o + 3 * i, fill, 3);
                } else {
                    o[3 * i] = (uint8_t)res[0][i];
                    o[3 * i + 1] = (uint8_t)res[1][i];
                    o[3 * i + 2] = (uint8_t)res[2][i];
                }
            }
        }
        warp_pixels(s, o, x, dw, y, a, filter, fill); /* the row's last 0-3 pixels */
    }
}

/* Eight output pixels per step with AVX-512 (where the CPU has it): the AVX2 steps' operations on twice
 * the lanes, so the same IEEE operations per pixel and the same bytes, with half the instructions
 * (`python bench/profiles.py autoaug` times it against AVX2). */
#define AVX512 __attribute__((target("avx2,avx512f,avx512vl,avx512dq,avx512bw")))
#define AVX512_INLINE AVX512 static inline __attribute__((always_inline))

AVX512_INLINE __m256i clip8i(__m256i v, int n) {
    return _mm256_min_epi32(_mm256_max_epi32(v, _mm256_setzero_si256()), _mm256_set1_epi32(n - 1));
}

AVX512_INLINE __m256i band8(__m256i word, int b) {
    return _mm256_and_si256(_mm256_srli_epi32(word, 8 * b), _mm256_set1_epi32(0xFF));
}

typedef struct {
    __m512d dx, dy; /* fractional positions */
    __m256i ix, iy; /* floor of the positions */
} Where8;

AVX512_INLINE __mmask8 inside_rows8(__m256i y, int h) {
    return _mm256_cmpge_epi32_mask(y, _mm256_setzero_si256()) & _mm256_cmplt_epi32_mask(y, _mm256_set1_epi32(h));
}

AVX512_INLINE int past_end8(const Source *s, __m256i off) { /* a 4-byte load at off passes the end */
    return _mm256_cmpgt_epi32_mask(off, _mm256_set1_epi32((int)(s->len - 4))) != 0;
}

AVX512_INLINE __m256i band_bytes8(__m512d v, int b) {
    __m256i bytes = _mm256_and_si256(_mm512_cvttpd_epi32(v), _mm256_set1_epi32(0xFF));
    return _mm256_slli_epi32(bytes, 8 * b);
}

/* bilinear4 on eight lanes */
AVX512_INLINE int bilinear8(const Source *s, const Where8 *p, __m256i *words) {
    const __m256i w3 = _mm256_set1_epi32(s->w * 3), three = _mm256_set1_epi32(3), one = _mm256_set1_epi32(1);
    __m256i y0 = clip8i(p->iy, s->h), iy1 = _mm256_add_epi32(p->iy, one);
    __mmask8 row1 = inside_rows8(iy1, s->h);
    __m256i r0 = _mm256_mullo_epi32(y0, w3), r1 = _mm256_mullo_epi32(_mm256_mask_blend_epi32(row1, y0, iy1), w3);
    __m256i c0 = _mm256_mullo_epi32(clip8i(p->ix, s->w), three);
    __m256i c1 = _mm256_mullo_epi32(clip8i(_mm256_add_epi32(p->ix, one), s->w), three);
    if (past_end8(s, _mm256_add_epi32(r0, c1)) || past_end8(s, _mm256_add_epi32(r1, c1)))
        return 0; /* c1 >= c0 in every lane */
    const int *base = (const int *)s->src;
    __m256i g00 = _mm256_i32gather_epi32(base, _mm256_add_epi32(r0, c0), 1);
    __m256i g01 = _mm256_i32gather_epi32(base, _mm256_add_epi32(r0, c1), 1);
    __m256i g10 = _mm256_i32gather_epi32(base, _mm256_add_epi32(r1, c0), 1);
    __m256i g11 = _mm256_i32gather_epi32(base, _mm256_add_epi32(r1, c1), 1);
    __m256i out = _mm256_setzero_si256();
    for (int b = 0; b < 3; b++) {
        __m256i p00 = band8(g00, b), p01 = band8(g01, b), p10 = band8(g10, b), p11 = band8(g11, b);
        __m512d v1 = _mm512_add_pd(_mm512_cvtepi32_pd(p00), _mm512_mul_pd(_mm512_cvtepi32_pd(_mm256_sub_epi32(p01, p00)), p->dx));
        __m512d v2 = _mm512_add_pd(_mm512_cvtepi32_pd(p10), _mm512_mul_pd(_mm512_cvtepi32_pd(_mm256_sub_epi32(p11, p10)), p->dx));
        v2 = _mm512_mask_blend_pd(row1, v1, v2); /* no row below: v2 = v1 */
        __m512d v = _mm512_add_pd(v1, _mm512_mul_pd(_mm512_sub_pd(v2, v1), p->dy));
        out = _mm256_or_si256(out, band_bytes8(v, b));
    }
    *words = out;
    return 1;
}

/* cubic_ints and cubic_doubles on eight lanes, in the same order */
AVX512_INLINE __m512d cubic_ints8(__m256i q1, __m256i q2, __m256i q3, __m256i q4, __m512d d) {
    __m256i p2 = _mm256_add_epi32(_mm256_sub_epi32(_mm256_setzero_si256(), q1), q3);
    __m256i p3 = _mm256_sub_epi32(_mm256_add_epi32(_mm256_slli_epi32(_mm256_sub_epi32(q1, q2), 1), q3), q4);
    __m256i p4 = _mm256_add_epi32(_mm256_sub_epi32(_mm256_add_epi32(_mm256_sub_epi32(_mm256_setzero_si256(), q1), q2), q3), q4);
    __m512d inner = _mm512_add_pd(_mm512_cvtepi32_pd(p3), _mm512_mul_pd(d, _mm512_cvtepi32_pd(p4)));
    inner = _mm512_add_pd(_mm512_cvtepi32_pd(p2), _mm512_mul_pd(d, inner));
    return _mm512_add_pd(_mm512_cvtepi32_pd(q2), _mm512_mul_pd(d, inner));
}

AVX512_INLINE __m512d cubic_doubles8(__m512d v1, __m512d v2, __m512d v3, __m512d v4, __m512d d) {
    const __m512d two = _mm512_set1_pd(2.0);
    __m512d n1 = _mm512_castsi512_pd(_mm512_xor_si512(_mm512_castpd_si512(v1), _mm512_set1_epi64(INT64_MIN))); /* -v1 */
    __m512d p2 = _mm512_add_pd(n1, v3);
    __m512d p3 = _mm512_sub_pd(_mm512_add_pd(_mm512_mul_pd(two, _mm512_sub_pd(v1, v2)), v3), v4);
    __m512d p4 = _mm512_add_pd(_mm512_sub_pd(_mm512_add_pd(n1, v2), v3), v4);
    __m512d inner = _mm512_add_pd(p3, _mm512_mul_pd(d, p4));
    inner = _mm512_add_pd(p2, _mm512_mul_pd(d, inner));
    return _mm512_add_pd(v2, _mm512_mul_pd(d, inner));
}

/* bicubic4 on eight lanes */
AVX512_INLINE int bicubic8(const Source *s, const Where8 *p, __m256i *words) {
    const __m256i w3 = _mm256_set1_epi32(s->w * 3), three = _mm256_set1_epi32(3);
    __m256i x = _mm256_sub_epi32(p->ix, _mm256_set1_epi32(1)), y = _mm256_sub_epi32(p->iy, _mm256_set1_epi32(1));
    __m256i col[4], row[4];
    __mmask8 valid[4];
    for (int k = 0; k < 4; k++)
        col[k] = _mm256_mullo_epi32(clip8i(_mm256_add_epi32(x, _mm256_set1_epi32(k)), s->w), three);
    row[0] = _mm256_mullo_epi32(clip8i(y, s->h), w3);
    for (int k = 1; k < 4; k++) { /* a row outside the image repeats the previous one (below) */
        __m256i yk = _mm256_add_epi32(y, _mm256_set1_epi32(k));
        valid[k] = inside_rows8(yk, s->h);
        row[k] = _mm256_mask_blend_epi32(valid[k], row[0], _mm256_mullo_epi32(yk, w3));
    }
    for (int k = 0; k < 4; k++)
        if (past_end8(s, _mm256_add_epi32(row[k], col[3]))) /* col[3] is each lane's largest column */
            return 0;
    __m256i g[4][4];
    for (int k = 0; k < 4; k++)
        for (int c = 0; c < 4; c++)
            g[k][c] = _mm256_i32gather_epi32((const int *)s->src, _mm256_add_epi32(row[k], col[c]), 1);
    __m256i out = _mm256_setzero_si256();
    for (int b = 0; b < 3; b++) {
        __m512d v[4];
        for (int k = 0; k < 4; k++) {
            v[k] = cubic_ints8(band8(g[k][0], b), band8(g[k][1], b), band8(g[k][2], b), band8(g[k][3], b), p->dx);
            if (k > 0)
                v[k] = _mm512_mask_blend_pd(valid[k], v[k - 1], v[k]);
        }
        __m512d r = cubic_doubles8(v[0], v[1], v[2], v[3], p->dy);
        r = _mm512_min_pd(_mm512_max_pd(r, _mm512_setzero_pd()), _mm512_set1_pd(255.0)); /* then truncated */
        out = _mm256_or_si256(out, band_bytes8(r, b));
    }
    *words = out;
    return 1;
}

/* warp_avx2_filter on eight lanes */
AVX512_INLINE void warp_avx512_filter(const Source *s, uint8_t *out, int dw, int dh, const double *a,
                                      const int filter, const uint8_t *fill) {
    const __m512d a0 = _mm512_set1_pd(a[0]), a2 = _mm512_set1_pd(a[2]);
    const __m512d a3 = _mm512_set1_pd(a[3]), a5 = _mm512_set1_pd(a[5]);
    const __m512d half = _mm512_set1_pd(0.5), zero = _mm512_setzero_pd();
    const __m512d wd = _mm512_set1_pd((double)s->w), hd = _mm512_set1_pd((double)s->h);
    const __m512d lane = _mm512_setr_pd(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i fill_words = _mm256_set1_epi32(fill[0] | fill[1] << 8 | fill[2] << 16);
    const __m256i rgb_of_words = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
                                                  0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    for (int y = 0; y < dh; y++) {
        const __m512d yin = _mm512_set1_pd(y + 0.5);
        const __m512d by = _mm512_mul_pd(_mm512_set1_pd(a[1]), yin), ey = _mm512_mul_pd(_mm512_set1_pd(a[4]), yin);
        uint8_t *o = out + (size_t)y * dw * 3;
        int x = 0;
        for (; x + 8 <= dw; x += 8, o += 24) {
            /* x + 0.5 + k: exact, as the AVX2 code's setr */
            __m512d xin = _mm512_add_pd(_mm512_set1_pd(x + 0.5), lane);
            __m512d xx = _mm512_add_pd(_mm512_add_pd(_mm512_mul_pd(a0, xin), by), a2);
            __m512d yy = _mm512_add_pd(_mm512_add_pd(_mm512_mul_pd(a3, xin), ey), a5);
            __mmask8 outside = _mm512_cmp_pd_mask(xx, zero, _CMP_LT_OQ) | _mm512_cmp_pd_mask(xx, wd, _CMP_GE_OQ) |
                               _mm512_cmp_pd_mask(yy, zero, _CMP_LT_OQ) | _mm512_cmp_pd_mask(yy, hd, _CMP_GE_OQ);
            __m256i words = fill_words;
            if (outside != 0xFF) {
                __m512d xs = _mm512_sub_pd(xx, half), ys = _mm512_sub_pd(yy, half);
                __m512d fx = _mm512_roundscale_pd(xs, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
                __m512d fy = _mm512_roundscale_pd(ys, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
                Where8 p = {_mm512_sub_pd(xs, fx), _mm512_sub_pd(ys, fy), _mm512_cvttpd_epi32(fx), _mm512_cvttpd_epi32(fy)};
                if (!(filter == 2 ? bilinear8(s, &p, &words) : bicubic8(s, &p, &words))) {
                    warp_pixels(s, o, x, x + 8, y, a, filter, fill); /* a load would pass the end */
                    continue;
                }
                words = _mm256_mask_blend_epi32(outside, words, fill_words);
            }
            __m256i rgb = _mm256_shuffle_epi8(words, rgb_of_words); /* 12 bytes per 128-bit half */
            __m128i lo = _mm256_castsi256_si128(rgb), hi = _mm256_extracti128_si256(rgb, 1);
            int32_t w;
            _mm_storel_epi64((__m128i *)o, lo);
            w = _mm_extract_epi32(lo, 2);
            memcpy(o + 8, &w, 4);
            _mm_storel_epi64((__m128i *)(o + 12), hi);
            w = _mm_extract_epi32(hi, 2);
            memcpy(o + 20, &w, 4);
        }
        warp_pixels(s, o, x, dw, y, a, filter, fill); /* the row's last 0-7 pixels */
    }
}

AVX512 static void warp_avx512(const Source *s, uint8_t *out, int dw, int dh, const double *a, int filter,
                               const uint8_t *fill) {
    if (filter == 2)
        warp_avx512_filter(s, out, dw, dh, a, 2, fill);
    else
        warp_avx512_filter(s, out, dw, dh, a, 3, fill);
}
#endif

#include "_vector_level.h"

static PyObject *affine_rgb(PyObject *self, PyObject *args) {
    Py_buffer src, dst, fill;
    int sw, sh, dw, dh, filter;
    double a[6];
    if (!PyArg_ParseTuple(args, "y*iiw*iiddddddiy*", &src, &sw, &sh, &dst, &dw, &dh, &a[0], &a[1], &a[2], &a[3],
                          &a[4], &a[5], &filter, &fill))
        return NULL;
    const char *problem = NULL;
    if (sw < 1 || sh < 1 || dw < 1 || dh < 1)
        problem = "sizes must be positive";
    else if (src.len < (Py_ssize_t)sw * sh * 3 || dst.len != (Py_ssize_t)dw * dh * 3)
        problem = "src and dst must be packed width x height x 3 uint8 buffers";
    else if (fill.len != 3)
        problem = "fill must be 3 bytes";
    else if (filter != 2 && filter != 3)
        problem = "filter must be 2 (bilinear) or 3 (bicubic)";
    else
        for (int i = 0; i < 6; i++)
            if (!isfinite(a[i]))
                problem = "the matrix must be finite";
    if (problem == NULL) {
        Source s = {(const uint8_t *)src.buf, src.len, sw, sh};
        Py_BEGIN_ALLOW_THREADS
#ifdef HAVE_AVX2_VARIANT
        int gathers = src.len >= 4 && src.len < ((Py_ssize_t)1 << 31); /* 32-bit gather offsets: under 2 GiB */
        if (gathers && use_avx512)
            warp_avx512(&s, (uint8_t *)dst.buf, dw, dh, a, filter, (const uint8_t *)fill.buf);
        else if (gathers && use_avx2)
            warp_avx2(&s, (uint8_t *)dst.buf, dw, dh, a, filter, (const uint8_t *)fill.buf);
        else
#endif
            warp_scalar(&s, (uint8_t *)dst.buf, dw, dh, a, filter, (const uint8_t *)fill.buf);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&fill);
    if (problem != NULL) {
        PyErr_Format(PyExc_ValueError, "affine_rgb: %s", problem);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"affine_rgb", affine_rgb, METH_VARARGS,
     "affine_rgb(src, src_w, src_h, dst, dst_w, dst_h, a0, a1, a2, a3, a4, a5, filter, fill): Pillow's "
     "AFFINE transform of a packed RGB uint8 image with filter 2 (bilinear) or 3 (bicubic); points outside "
     "the source get the 3 bytes of fill. ValueError on mismatched sizes or a non-finite matrix."},
    VECTOR_LEVEL_METHODS,
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_warp", NULL, -1, methods};

PyMODINIT_FUNC PyInit__warp(void) {
    vector_level_init();
    return PyModule_Create(&module);
}
