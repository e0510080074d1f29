/* tests/cuda_emu/include/cuda_fp16.h — the CUDA emulation stands in for the toolkit header (kemu.h). */
#include "tests/cuda_emu/kemu.h"
