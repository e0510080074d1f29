/*
 * kernels/cpu/att_avx512.c — the chunk loop of causal attention (att_chunk.h) compiled with
 * AVX-512 F/BW/VL/DQ (only this file is; attention.c calls it when kisa_current() is AVX-512 and
 * the head size 64). Same bits as the AVX2 build: see att_chunk.h.
 */
#define ATT_CHUNKS katt_chunks_avx512
#define ATT_CHUNKS_SCOPE
#include "kernels/cpu/att_chunk.h"
