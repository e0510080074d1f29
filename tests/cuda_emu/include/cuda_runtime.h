/* tests/cuda_emu/include/cuda_runtime.h — the CUDA emulation stands in for the toolkit header (kemu.h). */
#include "tests/cuda_emu/kemu.h"
