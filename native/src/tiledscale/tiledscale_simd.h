/*
 * TiledScale2D against the vector layer (simd/README.md). Same products as scalar.c,
 * (x * ver) * hor, so the results are bit-identical. In place (src == dst) is allowed:
 * every vector is loaded before it is stored and no vector re-reads an element already
 * stored.
 *
 * Stores go to whole 64-byte lines of dst wherever possible (a store that splits a cache
 * line costs about twice as much, and NumPy arrays are only 16-byte aligned), with masked
 * parts at the ends:
 *   NCHW, W >= 16: one stream over all rows, so a vector may straddle two rows and then
 *     takes its factors from both (see there).
 *   NCHW, W < 16: per channel; a vector starting at column phase f needs
 *     ver[(f + l) % W] and hor[row + (f + l) / W] in lane l, permuted from registers.
 *   NHWC, C <= 1024: per image row; ver is contiguous along the row and hor repeats with
 *     period C, read from a copy of the hor row extended by 15 values.
 *   NHWC, C > 1024: one stream over all pixels, joining at pixel boundaries.
 */
#include "vmath_scalar.h"

#include "kernels.h"
#include "tensorops.h"

#define F TN_LANES

/* Floats from p to the next 64-byte boundary. */
static inline size_t gap(const float * p) { return ((0 - (uintptr_t)p) & 63) / sizeof(float); }

static inline vfloat scale(vfloat x, vfloat v, vfloat h) { return v_mul(v_mul(x, v), h); }

/* Lanes [0, lo) from a[0, lo), lanes [lo, F) from b[0, F - lo); 0 < lo < F. The second
 * part is a masked load whose lanes start lo floats before b: the masked-off lanes are
 * never read, so the address may lie before the array. */
static inline vfloat join(const float * a, size_t lo, const float * b)
{
    vmask m = m_first(lo);
    const float * bl = (const float *)((uintptr_t)b - lo * sizeof(float));
    return v_select(m, v_load_mask(a, m), v_load_mask(bl, m_not(m)));
}

/* NCHW, W >= F: rows g = c * H + h of W floats, factors ver + c * W and hor[g]. A vector
 * that straddles two rows of one channel takes its ver factors from `wrap`, the last F
 * and the first F factors of the channel's row side by side (written once per channel:
 * cheaper than a join per row); across two channels they are contiguous in ver. */
static void nchw_wide(const float * src, size_t channels, size_t height, size_t width, const float * ver,
                      const float * hor, float * dst)
{
    float wrap[2 * F];
    size_t rows = channels * height, s = gap(dst); /* s: first column of the row still to do */
    if (s)
        v_store_n(dst, scale(v_load_n(src, s), v_load_n(ver, s), v_set1(hor[0])), s);
    const float * v = ver;
    for (size_t g = 0, h = 0; g < rows; ++g) {
        const float * x = src + g * width;
        float * y = dst + g * width;
        const vfloat k = v_set1(hor[g]);
        if (h == 0) {
            v_store(wrap, v_load(v + width - F));
            v_store(wrap + F, v_load(v));
        }
        size_t col = s;
        for (; col + 2 * F <= width; col += 2 * F) {
            vfloat r0 = scale(v_load(x + col), v_load(v + col), k);
            vfloat r1 = scale(v_load(x + col + F), v_load(v + col + F), k);
            v_store(y + col, r0);
            v_store(y + col + F, r1);
        }
        if (col + F <= width) {
            v_store(y + col, scale(v_load(x + col), v_load(v + col), k));
            col += F;
        }
        const float * vn = v; /* ver row of row g + 1 */
        if (++h == height) {
            h = 0;
            vn = v + width;
        }
        s = 0;
        if (col < width) {
            size_t lo = width - col;
            if (g + 1 < rows) {
                vfloat kk = v_select(m_first(lo), k, v_set1(hor[g + 1]));
                vfloat vv = vn == v ? v_load(wrap + F - lo) : v_load(v + col);
                v_store(y + col, scale(v_load(x + col), vv, kk));
                s = F - lo;
            } else {
                v_store_n(y + col, scale(v_load_n(x + col, lo), v_load_n(v + col, lo), k), lo);
            }
        }
        v = vn;
    }
}

/* NHWC, C > TN_TILED_ROW: pixels p = h * W + w of C floats, factors ver + w * C and
 * hor + h * C. */
static void nhwc_wide(const float * src, size_t channels, size_t height, size_t width, const float * ver,
                      const float * hor, float * dst)
{
    size_t pixels = height * width, s = gap(dst);
    if (s)
        v_store_n(dst, scale(v_load_n(src, s), v_load_n(ver, s), v_load_n(hor, s)), s);
    const float *v = ver, *hr = hor;
    for (size_t p = 0, w = 0; p < pixels; ++p) {
        const float * x = src + p * channels;
        float * y = dst + p * channels;
        size_t col = s;
        for (; col + F <= channels; col += F)
            v_store(y + col, scale(v_load(x + col), v_load(v + col), v_load(hr + col)));
        const float *vn = v + channels, *hn = hr; /* factors of pixel p + 1 */
        if (++w == width) {
            w = 0;
            vn = ver;
            hn = hr + channels;
        }
        s = 0;
        if (col < channels) {
            size_t lo = channels - col;
            if (p + 1 < pixels) {
                v_store(y + col, scale(v_load(x + col), join(v + col, lo, vn), join(hr + col, lo, hn)));
                s = F - lo;
            } else {
                v_store_n(y + col, scale(v_load_n(x + col, lo), v_load_n(v + col, lo), v_load_n(hr + col, lo)), lo);
            }
        }
        v = vn;
        hr = hn;
    }
}

/* NCHW, W < F: per channel, a masked head up to dst's line boundary, whole vectors, a
 * masked tail. */
static void nchw_narrow(const float * src, size_t channels, size_t height, size_t width, const float * ver,
                        const float * hor, float * dst)
{
    vint col[F], row[F];
    vfloat vt[F];
    for (size_t f = 0; f < width; ++f) {
        int32_t tc[F], tr[F];
        for (size_t l = 0; l < F; ++l) {
            tc[l] = (int32_t)((f + l) % width);
            tr[l] = (int32_t)((f + l) / width); /* < F */
        }
        col[f] = vi_load(tc);
        row[f] = vi_load(tr);
    }
    size_t total = height * width, step = F % width, rstep = F / width;
    for (size_t c = 0; c < channels; ++c) {
        const float *x = src + c * total, *hc = hor + c * height;
        float * y = dst + c * total;
        vfloat vv = v_load_n(ver + c * width, width);
        for (size_t f = 0; f < width; ++f)
            vt[f] = v_permute(vv, col[f]);
        size_t e = gap(y) < total ? gap(y) : total, f = 0, r = 0;
        if (e) {
            vfloat hv = v_load_n(hc, height);
            v_store_n(y, scale(v_load_n(x, e), vt[0], v_permute(hv, row[0])), e);
            f = e % width;
            r = e / width;
        }
        for (; e + F <= total; e += F) {
            vfloat hv = v_load_n(hc + r, height - r);
            v_store(y + e, scale(v_load(x + e), vt[f], v_permute(hv, row[f])));
            f += step;
            r += rstep;
            if (f >= width) {
                f -= width;
                r += 1;
            }
        }
        if (e < total) {
            vfloat hv = v_load_n(hc + r, height - r);
            v_store_n(y + e, scale(v_load_n(x + e, total - e), vt[f], v_permute(hv, row[f])), total - e);
        }
    }
}

/* NHWC, C <= TN_TILED_ROW: per image row of W * C floats, whose ver factors are
 * contiguous (ver[w * C + c]) and whose hor factors repeat with period C. The hor row is
 * first written to t with its first F - 1 values repeated after it, so the factors of any
 * vector are one unaligned load at t + (channel phase). A masked head up to dst's line
 * boundary, whole vectors, a masked tail. */
#define TN_TILED_ROW 1024
static void nhwc_rows(const float * src, size_t channels, size_t height, size_t width, const float * ver,
                      const float * hor, float * dst)
{
    float t[TN_TILED_ROW + F - 1];
    size_t n = width * channels, step = F % channels;
    for (size_t h = 0; h < height; ++h) {
        const float *x = src + h * n, *hr = hor + h * channels;
        float * y = dst + h * n;
        for (size_t j = 0; j < channels; ++j)
            t[j] = hr[j];
        for (size_t j = channels; j < channels + F - 1; ++j)
            t[j] = t[j - channels];
        size_t i = gap(y) < n ? gap(y) : n, f = i % channels;
        if (i)
            v_store_n(y, scale(v_load_n(x, i), v_load_n(ver, i), v_load(t)), i);
        for (; i + 2 * F <= n; i += 2 * F) {
            size_t f1 = f + step;
            f1 -= f1 >= channels ? channels : 0;
            vfloat r0 = scale(v_load(x + i), v_load(ver + i), v_load(t + f));
            vfloat r1 = scale(v_load(x + i + F), v_load(ver + i + F), v_load(t + f1));
            v_store(y + i, r0);
            v_store(y + i + F, r1);
            f = f1 + step;
            f -= f >= channels ? channels : 0;
        }
        if (i + F <= n) {
            v_store(y + i, scale(v_load(x + i), v_load(ver + i), v_load(t + f)));
            i += F;
            f += step;
            f -= f >= channels ? channels : 0;
        }
        if (i < n)
            v_store_n(y + i, scale(v_load_n(x + i, n - i), v_load_n(ver + i, n - i), v_load(t + f)), n - i);
    }
}

void TN_ISA(SynetTiledScale2D32f)(const float * src, size_t channels, size_t height, size_t width, int format,
                                  const float * ver, const float * hor, float * dst)
{
    if (channels == 0 || height == 0 || width == 0)
        return;
    if (format == TnTensorFormatNhwc) {
        if (channels <= TN_TILED_ROW)
            nhwc_rows(src, channels, height, width, ver, hor, dst);
        else
            nhwc_wide(src, channels, height, width, ver, hor, dst);
    } else {
        if (width < F)
            nchw_narrow(src, channels, height, width, ver, hor, dst);
        else
            nchw_wide(src, channels, height, width, ver, hor, dst);
    }
}
