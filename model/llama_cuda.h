/*
 * model/llama_cuda — one part of the Llama forward on a GPU (the GPU worker: orochi-worker
 * --device gpu). Built only with CUDA (CMake OROCHI_CUDA).
 *
 * The part is an ordinary llama_ctx (its partition, tree lists, prefix lengths and shared block
 * are the CPU's), and llama_gpu_forward runs exactly the steps llama_forward runs, meeting the
 * other parts at the same synchronisation points, with the GPU op set (kernels/cuda): so CPU and
 * GPU workers mix in one group under any partition plan. The shared block — the KV cache and the
 * activations parts exchange, normally the shared-memory arena — stays in host memory and is
 * mapped for the device (cudaHostRegister): kernels read and write it in place, which is the
 * unified-memory path of machines whose CPU and GPU share memory; the weight matrices and norms
 * are copied into device memory once. Before each synchronisation point the stream is drained,
 * and the host waits at the barrier.
 */
#ifndef OROCHI_LLAMA_CUDA_H
#define OROCHI_LLAMA_CUDA_H

#include "model/llama.h"

typedef struct llama_gpu llama_gpu;

/* Put ctx's forward on CUDA device `device`. [map_base, map_base + map_bytes) is host memory that
 * holds the context's shared block and the logits the forward writes (the arena): it is
 * registered with the device. Refused, with err naming the reason: a weight type the GPU does not
 * take, a KV cache that is not f32, a prefix source or screening head, a shared block outside the
 * map, no device. */
llama_gpu *llama_gpu_new(llama_ctx *ctx, int device, void *map_base, size_t map_bytes, char *err,
                         size_t errlen);
void llama_gpu_destroy(llama_gpu **gpu);
/* llama_forward on the GPU: the same batch rules, results and synchronisation points; logits
 * (inside the map, or NULL) as llama_forward writes them. 0, or -1 with err. */
int llama_gpu_forward(llama_gpu *gpu, const llama_batch *b, float *logits, char *err,
                      size_t errlen);
/* The device's name and memory, for logs ("NVIDIA H100 80GB HBM3, 79 GiB"). */
const char *llama_gpu_describe(const llama_gpu *gpu);

#endif
