/* Native float32 kernels of the built-in engine (decoder.py, sampling.py): matrix products on packed weights,
 * and for a decode step (one new token per sequence) attention with the rotary embedding and the cache write,
 * RMSNorm, the SiLU gate and sampling.
 *
 * Plain C with OpenMP and GCC/clang vector extensions: no intrinsics (the compiler picks the instructions of
 * the CPU it compiles on, -march=native) and no torch headers, so it builds in about a second
 * (asyncrl/engine/native.py). Each kernel computes what the torch path computes, up to float32 rounding;
 * tests/engine/test_native.py checks them against it. Threads: OpenMP, as many as torch uses (the same libgomp).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* exp(v) for |v| <= 87 (callers clamp) on 8 lanes: Cephes' single-precision polynomial on v = k ln2 + r,
 * |r| <= ln2 / 2, about 1 ulp. Written with GCC/clang vector extensions (the vectoriser will not vectorise the
 * bit cast that makes 2^k); where the CPU has narrower vectors the compiler splits them. */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8f vclamp(v8f v, float lo, float hi) {
    const v8f vlo = (v8f){0} + lo, vhi = (v8f){0} + hi;
    const v8i below = v < vlo, above = v > vhi; /* lanes all ones where true */
    v8i bits = ((v8i)v & ~below) | ((v8i)vlo & below);
    bits = (bits & ~above) | ((v8i)vhi & above);
    return (v8f)bits;
}

static inline v8f vexp(v8f v) {
    const v8f k = (v * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    const v8f r = v - k * 0.693359375f + k * 2.12194440e-4f;
    v8f p = (v8f){0} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    return p * (v8f)((__builtin_convertvector(k, v8i) + 127) << 23);
}

/* x = exp(x - m) in place, for x <= m; exactly 0 where x - m < -87 (exp underflows there; -inf gives 0). */
static inline v8f vexp_shifted(v8f v, float m) {
    v = v - m;
    const v8i below = v < ((v8f){0} - 87.0f);
    return (v8f)((v8i)vexp(vclamp(v, -87.0f, 87.0f)) & ~below);
}

static void exp_shifted(float *x, float m, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f v;
        memcpy(&v, x + i, sizeof v);
        v = vexp_shifted(v, m);
        memcpy(x + i, &v, sizeof v);
    }
    if (i < n) { /* the tail, through a padded vector */
        v8f v = (v8f){0};
        memcpy(&v, x + i, sizeof(float) * (n - i));
        v = vexp_shifted(v, m);
        memcpy(x + i, &v, sizeof(float) * (n - i));
    }
}

static inline v8f load8(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* a . b over n floats, n a multiple of 8 */
static inline float dot(const float *a, const float *b, int n) {
    v8f acc = (v8f){0};
    for (int i = 0; i < n; i += 8) acc += load8(a + i) * load8(b + i);
    float l[8];
    memcpy(l, &acc, sizeof l);
    return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

#if defined(__clang__)
#define SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUF(a, b, ...) __builtin_shuffle(a, b, (v8i){__VA_ARGS__})
#endif

/* The lane sums of eight vectors, as one vector: result[i] = sum of r[i]'s lanes (a transpose-add). */
static inline v8f hsum8(const v8f r[8]) {
    v8f u[4], w[2];
    for (int k = 0; k < 4; k++) /* u[k] = halves of r[k] and r[k + 4] added: [r[k] 4 partial, r[k+4] 4 partial] */
        u[k] = SHUF(r[k], r[k + 4], 0, 1, 2, 3, 8, 9, 10, 11) + SHUF(r[k], r[k + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    for (int k = 0; k < 2; k++) /* [r[k] 2, r[k+2] 2, r[k+4] 2, r[k+6] 2] */
        w[k] = SHUF(u[k], u[k + 2], 0, 1, 8, 9, 4, 5, 12, 13) + SHUF(u[k], u[k + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    /* lanes: [r0, r2, r4, r6] from w[0] interleaved with [r1, r3, r5, r7] from w[1] */
    return SHUF(w[0], w[1], 0, 8, 2, 10, 4, 12, 6, 14) + SHUF(w[0], w[1], 1, 9, 3, 11, 5, 13, 7, 15);
}

/* sc[j T + t] = q_j . K_t for the g query heads q (g, D) and the keys K (T, D); eight keys at a time, so
 * that their dot products are summed across lanes together. */
static void scores(const float *q, const float *K, float *sc, int g, int T, int D) {
    for (int j = 0; j < g; j++) {
        const float *qj = q + j * D;
        float *sj = sc + j * T;
        int t = 0;
        for (; t + 8 <= T; t += 8) {
            const float *k0 = K + (int64_t)t * D;
            v8f acc[8] = {{0}};
            for (int c = 0; c < D; c += 8) {
                const v8f qv = load8(qj + c);
                for (int r = 0; r < 8; r++) acc[r] += qv * load8(k0 + r * D + c);
            }
            const v8f out = hsum8(acc);
            memcpy(sj + t, &out, sizeof out);
        }
        for (; t < T; t++) sj[t] = dot(qj, K + (int64_t)t * D, D);
    }
}

/* o_j = sum_t p[j T + t] V_t for the g heads: per head, 32 output floats at a time stay in registers while
 * the values stream past. */
static void weighted_values(const float *p, const float *V, float *o, int g, int T, int D) {
    for (int j = 0; j < g; j++) {
        const float *pj = p + j * T;
        float *oj = o + j * D;
        int c = 0;
        for (; c + 32 <= D; c += 32) {
            v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int t = 0; t < T; t++) {
                const float *vt = V + (int64_t)t * D + c;
                const float w = pj[t];
                a0 += w * load8(vt);
                a1 += w * load8(vt + 8);
                a2 += w * load8(vt + 16);
                a3 += w * load8(vt + 24);
            }
            memcpy(oj + c, &a0, sizeof a0);
            memcpy(oj + c + 8, &a1, sizeof a1);
            memcpy(oj + c + 16, &a2, sizeof a2);
            memcpy(oj + c + 24, &a3, sizeof a3);
        }
        for (; c < D; c += 8) {
            v8f a = {0};
            for (int t = 0; t < T; t++) a += pj[t] * load8(V + (int64_t)t * D + c);
            memcpy(oj + c, &a, sizeof a);
        }
    }
}

/* out = x * sigmoid(x) * up for 8 lanes. */
static inline v8f vsilu_mul(v8f x, v8f up) { return x / (1.0f + vexp(-vclamp(x, -87.0f, 87.0f))) * up; }

/* Rotate the pairs (x[2i], x[2i+1]) of one head by the complex numbers rot[i] (interleaved cos, sin), times
 * scale. */
static void rotate(float *x, const float *rot, int half, float scale) {
#pragma omp simd
    for (int i = 0; i < half; i++) {
        float a = x[2 * i], b = x[2 * i + 1], c = rot[2 * i] * scale, s = rot[2 * i + 1] * scale;
        x[2 * i] = a * c - b * s;
        x[2 * i + 1] = a * s + b * c;
    }
}

/* One decoder layer's attention for a decode step, for S sequences in slots first_slot .. first_slot + S - 1:
 *   qkv   (S, nq + 2 nk, D)  the projection output, q and k heads in rotary-pair order (modified: q and k
 *                            are rotated in place);
 *   pos   (S,)               the position of each new token (= the number of positions already cached);
 *   rot   (max_len + 1, D/2) complex rotations (interleaved cos, sin);
 *   cache (2, slots, nk, cache_len, D) this layer's keys, then values: the new key and value are written at
 *                            pos, then each query head attends to positions 0 .. pos of its K/V head;
 *   out   (S, nq D)          the attention output, query heads in order;
 *   scratch (S nk, nq / nk, cache_len) the attention weights.
 * Query head h uses K/V head h / (nq / nk); q is scaled by q_scale (1/sqrt(D)) as it is rotated. One unit of
 * work is a (sequence, K/V head): it reads that head's keys once for its nq / nk query heads, then its
 * values once. */
void decode_attention(float *qkv, const int64_t *pos, const float *rot, float *cache, float *out, float *scratch,
                      int S, int first_slot, int slots, int nq, int nk, int D, int cache_len, float q_scale,
                      int threads) {
    const int g = nq / nk, half = D / 2, row = (nq + 2 * nk) * D;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int u = 0; u < S * nk; u++) {
        const int s = u / nk, kh = u % nk;
        const int64_t p = pos[s];
        const int T = (int)p + 1;
        float *q = qkv + (int64_t)s * row + (int64_t)kh * g * D;
        float *knew = qkv + (int64_t)s * row + (int64_t)(nq + kh) * D;
        const float *vnew = qkv + (int64_t)s * row + (int64_t)(nq + nk + kh) * D;
        const float *r = rot + p * D;  /* D/2 complex numbers = D floats per position */
        for (int j = 0; j < g; j++) rotate(q + j * D, r, half, q_scale);
        rotate(knew, r, half, 1.0f);
        float *K = cache + ((int64_t)(0 * slots + first_slot + s) * nk + kh) * cache_len * D;
        float *V = cache + ((int64_t)(1 * slots + first_slot + s) * nk + kh) * cache_len * D;
        for (int d = 0; d < D; d++) {
            K[p * D + d] = knew[d];
            V[p * D + d] = vnew[d];
        }
        float *sc = scratch + (int64_t)u * g * cache_len;
        scores(q, K, sc, g, T, D);
        for (int j = 0; j < g; j++) {
            float *sj = sc + j * T, m = -INFINITY, sum = 0.0f;
            for (int t = 0; t < T; t++) m = sj[t] > m ? sj[t] : m;
            exp_shifted(sj, m, T);
            for (int t = 0; t < T; t++) sum += sj[t];
            const float inv = 1.0f / sum;
            for (int t = 0; t < T; t++) sj[t] *= inv;
        }
        weighted_values(sc, V, out + (int64_t)s * nq * D + (int64_t)kh * g * D, g, T, D);
    }
}

/* out = silu(gu[:, :I]) * gu[:, I:] for rows of gu (M, 2 I): the gated activation of the MLP. */
void silu_mul(const float *gu, float *out, int M, int I, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int m = 0; m < M; m++) {
        const float *gate = gu + (int64_t)m * 2 * I, *up = gate + I;
        float *o = out + (int64_t)m * I;
        int i = 0;
        v8f x, u;
        for (; i + 8 <= I; i += 8) {
            memcpy(&x, gate + i, sizeof x);
            memcpy(&u, up + i, sizeof u);
            x = vsilu_mul(x, u);
            memcpy(o + i, &x, sizeof x);
        }
        if (i < I) {
            x = u = (v8f){0};
            memcpy(&x, gate + i, sizeof(float) * (I - i));
            memcpy(&u, up + i, sizeof(float) * (I - i));
            x = vsilu_mul(x, u);
            memcpy(o + i, &x, sizeof(float) * (I - i));
        }
    }
}

/* out[m] = x[m] / sqrt(mean(x[m]^2) + eps) * w for the M rows of x (M, N), N a multiple of 8: RMSNorm in
 * one pass (torch's CPU rms_norm is several ops). */
void rms_norm(const float *x, const float *w, float *out, int M, int N, float eps, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (M * N >= 16384)
    for (int m = 0; m < M; m++) {
        const float *xm = x + (int64_t)m * N;
        float *om = out + (int64_t)m * N;
        const float r = 1.0f / sqrtf(dot(xm, xm, N) / (float)N + eps);
        for (int i = 0; i < N; i += 8) {
            v8f v = load8(xm + i) * r * load8(w + i);
            memcpy(om + i, &v, sizeof v);
        }
    }
}

#define SAMPLE_BLOCK 1024

typedef float v4f __attribute__((vector_size(16)));
typedef double v4d __attribute__((vector_size(32)));

/* sum of x[0..n), accumulated in double: the sampling weights of a row span many orders of magnitude, and in
 * float32 a weight below half the rounding step of a running sum near 1 (~6e-8) adds nothing */
static double sum_double(const float *x, int n) {
    v4d acc = (v4d){0};
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        v4f v;
        memcpy(&v, x + i, sizeof v);
        acc += __builtin_convertvector(v, v4d);
    }
    double tail = 0.0;
    for (; i < n; i++) tail += x[i];
    return (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail;
}

/* w = x / t (or a copy of x where t == 1); returns the max of w (-inf for an empty or all -inf row) */
static float scale_max(const float *x, float *w, int n, float t) {
    v8f mx = (v8f){0} - INFINITY;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f v = load8(x + i);
        if (t != 1.0f) v = v / t;
        memcpy(w + i, &v, sizeof v);
        const v8i gt = v > mx;
        mx = (v8f)(((v8i)v & gt) | ((v8i)mx & ~gt));
    }
    float l[8], m = -INFINITY;
    memcpy(l, &mx, sizeof l);
    for (int j = 0; j < 8; j++) m = l[j] > m ? l[j] : m;
    for (; i < n; i++) {
        w[i] = t != 1.0f ? x[i] / t : x[i];
        m = w[i] > m ? w[i] : m;
    }
    return m;
}

/* One token per row of logits (S, V) and its log-probability under the distribution it is drawn from:
 * greedy rows take the first argmax and report its log-probability under the unscaled distribution; the
 * others draw from softmax(logits / temperature) by the inverse CDF with their uniform u in [0, 1): the first
 * index whose cumulative weight exceeds u * total, never past the last index of positive weight (block sums
 * of SAMPLE_BLOCK first, then a walk inside one block). scratch (S, V) receives the weights
 * exp(scaled - peak). The same computation as sampling.py's sample_rows without top-k/top-p. */
void sample(const float *logits, int S, int V, const float *temperature, const uint8_t *greedy, const float *u,
            int64_t *tokens, float *logprobs, float *scratch, int threads) {
    const int nb = (V + SAMPLE_BLOCK - 1) / SAMPLE_BLOCK;
#pragma omp parallel for schedule(static) num_threads(threads) if (S * V >= 16384)
    for (int s = 0; s < S; s++) {
        float *w = scratch + (int64_t)s * V;
        const float *l = logits + (int64_t)s * V, t = greedy[s] ? 1.0f : temperature[s];
        const float peak = scale_max(l, w, V, t);
        if (peak == -INFINITY) { /* nothing to draw from */
            tokens[s] = 0;
            logprobs[s] = -INFINITY;
            continue;
        }
        int tok = 0;
        if (greedy[s])
            while (w[tok] != peak) tok++;
        double block_sum[nb], total = 0.0; /* double: see sum_double */
        for (int b = 0; b < nb; b++) {
            const int lo = b * SAMPLE_BLOCK, n = lo + SAMPLE_BLOCK < V ? SAMPLE_BLOCK : V - lo;
            exp_shifted(w + lo, peak, n);
            block_sum[b] = sum_double(w + lo, n);
            total += block_sum[b];
        }
        if (!greedy[s]) {
            int last = V - 1;
            while (last > 0 && w[last] == 0.0f) last--;
            const double target = u[s] * total;
            double cum = 0.0;
            int b = 0;
            while (b + 1 < nb && cum + block_sum[b] <= target) cum += block_sum[b++];
            tok = last;
            for (int i = b * SAMPLE_BLOCK; i < last; i++) {
                cum += w[i];
                if (cum > target) {
                    tok = i;
                    break;
                }
            }
        }
        tokens[s] = tok;
        logprobs[s] = (t != 1.0f ? l[tok] / t : l[tok]) - peak - (float)log(total);
    }
}

/* ---- matrix products with packed weights ----------------------------------------------------------------
 * A weight W (K in, N out) is stored in panels of 16 output columns, Wp[N / 16][K][16] (decoder.py packs it,
 * zero-padding the last panel): the 16 weights that one input value multiplies are one contiguous pair of
 * vectors. A micro-kernel keeps an MR x 16 block of the output in registers over the whole K; blocks are
 * shared out to the threads with no synchronisation but the final barrier. For the small row counts of a
 * decode step this runs the two cores ~1.3x faster than MKL's sgemm (bench/engine.py, docs/engine.md). */
#define PANEL 16

#define KBLOCK 64 /* inputs summed per partial sum: the error of a float32 sum grows with its length */

#define MICRO(MR)                                                                                             \
    static inline void micro_##MR(const float *A, int K, const float *b, float *C, int ldc, int ncols,        \
                                  const float *bias, int accumulate) {                                        \
        v8f t0[MR], t1[MR];                                                                                   \
        for (int r = 0; r < MR; r++) t0[r] = t1[r] = (v8f){0};                                                \
        for (int k0 = 0; k0 < K; k0 += KBLOCK) {                                                              \
            const int k1 = k0 + KBLOCK < K ? k0 + KBLOCK : K;                                                 \
            v8f c0[MR], c1[MR];                                                                               \
            for (int r = 0; r < MR; r++) c0[r] = c1[r] = (v8f){0};                                            \
            for (int k = k0; k < k1; k++) {                                                                   \
                const v8f b0 = load8(b + k * PANEL), b1 = load8(b + k * PANEL + 8);                           \
                for (int r = 0; r < MR; r++) {                                                                \
                    const float a = A[(int64_t)r * K + k];                                                    \
                    c0[r] += a * b0;                                                                          \
                    c1[r] += a * b1;                                                                          \
                }                                                                                             \
            }                                                                                                 \
            for (int r = 0; r < MR; r++) {                                                                    \
                t0[r] += c0[r];                                                                               \
                t1[r] += c1[r];                                                                               \
            }                                                                                                 \
        }                                                                                                     \
        for (int r = 0; r < MR; r++) {                                                                        \
            float o[PANEL];                                                                                   \
            memcpy(o, &t0[r], sizeof t0[r]);                                                                  \
            memcpy(o + 8, &t1[r], sizeof t1[r]);                                                              \
            float *cr = C + (int64_t)r * ldc;                                                                 \
            for (int j = 0; j < ncols; j++) cr[j] = o[j] + (bias ? bias[j] : 0.0f) + (accumulate ? cr[j] : 0.0f); \
        }                                                                                                     \
    }
MICRO(1)
MICRO(2)
MICRO(3)
MICRO(4)
MICRO(5)
MICRO(6)

/* C (M, N) = A (M, K) @ W (+ bias (N,), if not NULL); with accumulate, C += A @ W (a residual add in place).
 * Work items are (rows, panel): up to 96 rows (a decode step) all rows at once, so each weight panel is read
 * from memory once; more rows (a prefill) in chunks of 48, so that a chunk of A stays in L2 while the panels
 * pass (with all rows at once A was read from L3 once per panel, and a 64 x 32-token prefill took 240 ms
 * against 211 ms through MKL). */
void gemm(const float *A, int M, int K, const float *Wp, int N, const float *bias, int accumulate, float *C,
          int threads) {
    if (M <= 0 || N <= 0) return;
    const int panels = (N + PANEL - 1) / PANEL, chunk = M <= 96 ? M : 48, chunks = (M + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) collapse(2) num_threads(threads)
    for (int rc = 0; rc < chunks; rc++)
        for (int p = 0; p < panels; p++) {
            const int n0 = p * PANEL, nc = N - n0 < PANEL ? N - n0 : PANEL, end = rc * chunk + chunk < M ? rc * chunk + chunk : M;
            const float *w = Wp + (int64_t)p * K * PANEL, *bi = bias ? bias + n0 : NULL;
            for (int i = rc * chunk; i < end; i += 6) {
                const float *a = A + (int64_t)i * K;
                float *c = C + (int64_t)i * N + n0;
                switch (end - i < 6 ? end - i : 6) {
                case 6: micro_6(a, K, w, c, N, nc, bi, accumulate); break;
                case 5: micro_5(a, K, w, c, N, nc, bi, accumulate); break;
                case 4: micro_4(a, K, w, c, N, nc, bi, accumulate); break;
                case 3: micro_3(a, K, w, c, N, nc, bi, accumulate); break;
                case 2: micro_2(a, K, w, c, N, nc, bi, accumulate); break;
                default: micro_1(a, K, w, c, N, nc, bi, accumulate); break;
                }
            }
        }
}
