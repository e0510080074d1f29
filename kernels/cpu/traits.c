/*
 * kernels/cpu/traits.c — what every type file stands on: the ggml type traits (name, block,
 * bytes per block, whether orochi computes with it) and the half / bfloat16 conversions.
 * types.c, ktypes_k.c and kquantize.c all call down here; nothing here calls up.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/kernels.h"

static const kt_traits TRAITS[] = {
    [KT_F32] = {"F32", 1, 4, true},
    [KT_F16] = {"F16", 1, 2, true},
    [KT_Q4_0] = {"Q4_0", 32, 18, true},
    [KT_Q4_1] = {"Q4_1", 32, 20, true},
    [6] = {"Q5_0", 32, 22, true},
    [7] = {"Q5_1", 32, 24, true},
    [KT_Q8_0] = {"Q8_0", 32, 34, true},
    [9] = {"Q8_1", 32, 36, false},
    [10] = {"Q2_K", 256, 84, true},
    [11] = {"Q3_K", 256, 110, true},
    [12] = {"Q4_K", 256, 144, true},
    [13] = {"Q5_K", 256, 176, true},
    [14] = {"Q6_K", 256, 210, true},
    [15] = {"Q8_K", 256, 292, false},
    [16] = {"IQ2_XXS", 256, 66, false},
    [17] = {"IQ2_XS", 256, 74, false},
    [18] = {"IQ3_XXS", 256, 98, false},
    [19] = {"IQ1_S", 256, 50, false},
    [20] = {"IQ4_NL", 32, 18, true},
    [21] = {"IQ3_S", 256, 110, false},
    [22] = {"IQ2_S", 256, 82, false},
    [23] = {"IQ4_XS", 256, 136, false},
    [24] = {"I8", 1, 1, false},
    [25] = {"I16", 1, 2, false},
    [26] = {"I32", 1, 4, false},
    [27] = {"I64", 1, 8, false},
    [28] = {"F64", 1, 8, false},
    [29] = {"IQ1_M", 256, 56, false},
    [KT_BF16] = {"BF16", 1, 2, true},
};

const kt_traits *kt_traits_of(uint32_t type)
{
    if (type >= sizeof TRAITS / sizeof TRAITS[0] || !TRAITS[type].name)
        return NULL;
    return &TRAITS[type];
}

size_t kt_row_bytes(uint32_t type, uint64_t n)
{
    const kt_traits *t = kt_traits_of(type);
    if (!t || n % (uint64_t)t->block)
        return 0;
    return (size_t)(n / (uint64_t)t->block) * (size_t)t->block_bytes;
}

/* ===== half and bfloat16 ===== */

float kt_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t kt_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffff;
    if (absx >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
    if (absx >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00);
    if (absx < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        float a;
        memcpy(&a, &absx, 4);
        /* a * 2^24 rounded to nearest even gives the subnormal mantissa */
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f));
    }
    /* normal: round mantissa to nearest even */
    uint32_t rounded = absx + 0x0fff + ((absx >> 13) & 1);
    return (uint16_t)(sign | (((rounded >> 13) - ((127 - 15) << 10)) & 0x7fff));
}

float kt_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t kt_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40); /* quiet nan */
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}
