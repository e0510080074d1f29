/*
 * kernels/cpu/ktypes_k.c — reading the K-quants (Q2_K..Q6_K), Q5_0/Q5_1 and IQ4_NL: every
 * element's bits and every packed scale, decoded into one common form (ktk_block, see
 * ktypes_k.h), and the dequantisation of rows from it.
 *
 * This is the one place that knows where these formats keep their bits. The dequantiser is the
 * scalar reference the matmul kernels are tested against; the matmul's packing (matmul.c) uses
 * ktk_unpack to lay the same codes and scales out for its micro-kernels. The quantisers that
 * write these formats live in kquantize.c.
 */
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/ktypes_k.h"

const int8_t KTK_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                              1,    13,   25,  38,  53,  69,  89,  113};

int ktk_is_k(uint32_t type)
{
    switch (type) {
    case KT_Q5_0:
    case KT_Q5_1:
    case KT_IQ4_NL:
    case KT_Q2_K:
    case KT_Q3_K:
    case KT_Q4_K:
    case KT_Q5_K:
    case KT_Q6_K:
        return 1;
    default:
        return 0;
    }
}

static float ktk_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return kt_f16_to_f32(h);
}

static uint32_t ktk_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Sub-block j (0..7) of the 12 bytes of 6-bit scales and mins of Q4_K / Q5_K. */
static void ktk_scale_min(const uint8_t *s, int j, int16_t *sc, int16_t *mn)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (int16_t)((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
        *mn = (int16_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* The 32-element types: nibbles as Q4_0 (element j < 16 low nibble of qs[j], j + 16 high), with
 * an optional fifth bit per element in qh. */
static void ktk_unpack32(const uint8_t *qs, const uint8_t *qh, ktk_block *u)
{
    uint32_t h = qh ? ktk_u32(qh) : 0;
    for (int j = 0; j < 16; j++) {
        u->code[j] = (uint8_t)((qs[j] & 15) | ((h >> j) & 1) << 4);
        u->code[j + 16] = (uint8_t)((qs[j] >> 4) | ((h >> (j + 16)) & 1) << 4);
    }
    u->sc[0] = u->sc[1] = 1;
    u->mn[0] = u->mn[1] = 1;
}

void ktk_unpack(uint32_t type, const uint8_t *b, ktk_block *u)
{
    u->z = 0;
    u->M = 0.0f;
    switch (type) {
    case KT_Q5_0:
        u->n = 32;
        u->D = ktk_f16(b);
        u->z = 16;
        ktk_unpack32(b + 6, b + 2, u);
        return;
    case KT_Q5_1:
        u->n = 32;
        u->D = ktk_f16(b);
        u->M = ktk_f16(b + 2);
        ktk_unpack32(b + 8, b + 4, u);
        return;
    case KT_IQ4_NL:
        u->n = 32;
        u->D = ktk_f16(b);
        u->z = 128;
        ktk_unpack32(b + 2, NULL, u);
        for (int e = 0; e < 32; e++)
            u->code[e] = (uint8_t)(KTK_IQ4NL[u->code[e]] + 128);
        return;
    default:
        break;
    }
    u->n = 256;
    if (type == KT_Q4_K || type == KT_Q5_K) {
        /* d, dmin, scales[12], (Q5_K: qh[32]), qs[128]; chunk c of 64: qs[32c + l] low nibble
         * is element 64c + l, high nibble 64c + 32 + l; Q5_K's fifth bits are bits 2c and 2c + 1
         * of qh[l] */
        u->D = ktk_f16(b);
        u->M = -ktk_f16(b + 2);
        const uint8_t *qh = type == KT_Q5_K ? b + 16 : NULL, *qs = b + (qh ? 48 : 16);
        for (int j = 0; j < 8; j++) {
            ktk_scale_min(b + 4, j, &u->sc[2 * j], &u->mn[2 * j]);
            u->sc[2 * j + 1] = u->sc[2 * j];
            u->mn[2 * j + 1] = u->mn[2 * j];
        }
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                uint8_t q = qs[32 * c + l];
                int h0 = qh ? (qh[l] >> (2 * c)) & 1 : 0, h1 = qh ? (qh[l] >> (2 * c + 1)) & 1 : 0;
                u->code[64 * c + l] = (uint8_t)((q & 15) | h0 << 4);
                u->code[64 * c + 32 + l] = (uint8_t)((q >> 4) | h1 << 4);
            }
        return;
    }
    if (type == KT_Q6_K) {
        /* ql[128], qh[64], scales[16] (int8), d; half n of 128: ql += 64n, qh += 32n */
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        u->D = ktk_f16(b + 208);
        u->z = 32;
        for (int s = 0; s < 16; s++) {
            u->sc[s] = sc[s];
            u->mn[s] = 0;
        }
        for (int n = 0; n < 2; n++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *L = ql + 64 * n, *H = qh + 32 * n;
                uint8_t *c = u->code + 128 * n;
                c[l] = (uint8_t)((L[l] & 15) | ((H[l] >> 0) & 3) << 4);
                c[l + 32] = (uint8_t)((L[l + 32] & 15) | ((H[l] >> 2) & 3) << 4);
                c[l + 64] = (uint8_t)((L[l] >> 4) | ((H[l] >> 4) & 3) << 4);
                c[l + 96] = (uint8_t)((L[l + 32] >> 4) | ((H[l] >> 6) & 3) << 4);
            }
        return;
    }
    /* Q2_K and Q3_K: 2-bit q; half n of 128 elements uses qs[32n .. 32n + 31], element
     * 128n + 32j + l is bits 2j..2j+1 of qs[32n + l], in sub-block 8n + 2j + l / 16 */
    const uint8_t *qs, *hm = NULL;
    if (type == KT_Q2_K) {
        qs = b + 16;
        u->D = ktk_f16(b + 80);
        u->M = -ktk_f16(b + 82);
        for (int s = 0; s < 16; s++) {
            u->sc[s] = b[s] & 15;
            u->mn[s] = b[s] >> 4;
        }
    } else { /* Q3_K: hmask[32], qs[64], scales[12], d */
        hm = b;
        qs = b + 32;
        const uint8_t *s12 = b + 96;
        u->D = ktk_f16(b + 108);
        u->z = 4;
        for (int s = 0; s < 16; s++) {
            int lo = (s12[s % 8] >> (4 * (s / 8))) & 15, hi = (s12[8 + s % 4] >> (2 * (s / 4))) & 3;
            u->sc[s] = (int16_t)((lo | hi << 4) - 32);
            u->mn[s] = 0;
        }
    }
    for (int n = 0; n < 2; n++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                int q = (qs[32 * n + l] >> (2 * j)) & 3;
                if (hm)
                    q += 4 * ((hm[l] >> (4 * n + j)) & 1);
                u->code[128 * n + 32 * j + l] = (uint8_t)q;
            }
}

void ktk_dequantize_row(uint32_t type, const void *row, float *out, int64_t n)
{
    const kt_traits *tr = kt_traits_of(type);
    const uint8_t *p = row;
    ktk_block u;
    for (int64_t b = 0; b < n / tr->block; b++, p += tr->block_bytes, out += tr->block) {
        ktk_unpack(type, p, &u);
        for (int e = 0; e < u.n; e++) {
            float f = u.D * (float)u.sc[e / 16];
            out[e] = f * (float)(u.code[e] - u.z) + u.M * (float)u.mn[e / 16];
        }
    }
}
