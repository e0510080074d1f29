/* tests/cuda_emu/include/cublas_v2.h — the CUDA emulation stands in for the toolkit header (kemu.h). */
#include "tests/cuda_emu/kemu.h"
