/*
 * model/medusa — Medusa heads: extra decoding heads that read the target's last hidden state and
 * guess tokens further ahead than the target's own next-token prediction.
 *
 * A side GGUF (general.architecture = "orochi-medusa", format in docs/medusa.md) carries K heads
 * for one target model. Head k maps the target's final hidden state h of the last accepted token
 * (the residual stream after the last layer, before the output norm) to logits for the token
 * k + 2 positions ahead of that token:
 *
 *     z = h + silu(W_k h + b_k)            W_k: [dim x dim] any supported type, b_k optional
 *     logits = lm_head(rmsnorm(z) * output_norm)
 *
 * with the target's output_norm and lm_head, or the head's own out.weight when the file has one.
 * The target's lm_head gives the token one position ahead (the token the coordinator commits as
 * correction/bonus); head 0 the one after it, head 1 the one after that, and so on. The heads do
 * not see which branch was taken, so a draft tree repeats the same candidates under every parent.
 *
 * After llama_forward, the hidden state of batch token i is llama_ctx_shared(ctx)->x + i * dim.
 * Weights stay in the mapping (no copies); a loaded medusa borrows the target, which must outlive
 * it. The functions below keep no mutable state in the medusa, so threads may share one.
 */
#ifndef OROCHI_MEDUSA_H
#define OROCHI_MEDUSA_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kernels.h"
#include "model/llama.h"

#define MEDUSA_MAX_HEADS 64

typedef struct medusa medusa;

/* Load and validate against the target (architecture, dims, vocab, tensor shapes and types, no
 * unknown tensors). On failure NULL and one line in err naming the file and the key or tensor. */
medusa *medusa_load(const char *path, const llama_model *target, char *err, size_t errlen);
void medusa_destroy(medusa **m);
/* Number of heads K. */
int medusa_heads(const medusa *m);
/* Whether head k carries its own out.weight (otherwise it uses the target's lm_head). */
int medusa_head_own_out(const medusa *m, int k);
/* The informational medusa.target string ("" when absent). */
const char *medusa_target_name(const medusa *m);

/* logits (vocab floats) of head k for hidden state h (dim floats). `pool` may be NULL.
 * Returns 0, or -1 for a bad k, NULL buffers or out of memory. */
int medusa_head_logits(const medusa *m, kpool *pool, int k, const float *hidden, float *logits);

/* Build a draft tree from the heads for hidden state h through a tree template: tmpl[d] = how many
 * top candidates of head d to branch into at depth d + 1 (e.g. {3, 2, 1}). The root (depth 0) is
 * the token the target itself produced after h's position, already committed; it is not emitted.
 * Level 1 holds the top tmpl[0] tokens of head 0 (parent -1 = child of the root); level d + 1
 * holds the top tmpl[d] tokens of head d under each node of level d. Nodes are emitted level by
 * level (so parents come first); within a level in decreasing order of the path probability
 * (product of the head probabilities from level 1 down), ties by parent order then candidate rank;
 * emission stops at max_nodes. `depth` is clamped to the head count, and a template entry <= 0
 * ends the tree there. tokens/parent/conf receive up to max_nodes entries: the token, its parent's
 * index (-1 for level 1), and the head's softmax probability of the token. Siblings never repeat a
 * token. Returns the node count, or -1 for bad arguments or out of memory. */
int medusa_draft_tree(const medusa *m, kpool *pool, const float *hidden, const int *tmpl, int depth,
                      int max_nodes, int32_t *tokens, int32_t *parent, float *conf);

/* Draft exactly a given tree shape (the plan's calibrated tree, docs/speculation.md): shape node
 * i + 1 (i < n_shape) is the srank[i]-th best candidate (0-based) of head d - 1 below shape node
 * sparent[i] (0: the root; parents first), d being its depth. Nodes deeper than `depth` or the
 * head count, beyond the first max_nodes, or below a dropped node are dropped. Emitted level by
 * level, under each parent (in emission order) its children by increasing rank, so a node's rank
 * among its siblings in the draft equals its rank in the shape; a rank repeated under one parent
 * is emitted once. tokens/parent/conf as for medusa_draft_tree. Returns the node count, or -1
 * for bad arguments (a parent that does not come first, a negative rank) or out of memory. */
int medusa_draft_shape(const medusa *m, kpool *pool, const float *hidden, const int32_t *sparent,
                       const int32_t *srank, int n_shape, int depth, int max_nodes, int32_t *tokens,
                       int32_t *parent, float *conf);

#endif
