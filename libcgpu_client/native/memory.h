/* What memory.c, pools.c and context.c share: the table of what this process took (address or handle -> bytes,
 * GPU and, for a pool's allocation, its pool) and the reservation against the instance's ledger. */
#ifndef CGPU_MEMORY_H
#define CGPU_MEMORY_H

#include "hooks.h"

/* Keys beside device addresses (below 2^57 on every GPU): a cuMemCreate handle, an array, a mipmapped array, a
 * context. */
#define HANDLE_TAG (1ULL << 63)
#define CONTEXT_TAG (1ULL << 61)
#define ARRAY_TAG (1ULL << 62)
#define MIPMAP_TAG (3ULL << 62)

CGPU_HIDDEN void cgpu_track(uint64_t key, int64_t bytes, int pos, void *owner);
/* Forget key; 1 and its size, GPU and owner when it was tracked. */
CGPU_HIDDEN int cgpu_untrack(uint64_t key, int64_t *bytes, int *pos, void **owner);

/* Reserve bytes on GPU pos for a call about to be made: CUDA_SUCCESS, or the error to return (past the limit:
 * CUDA_ERROR_OUT_OF_MEMORY; refused registration: CGPU_REFUSED_ERROR). Unchecked (no daemon) counts as reserved. */
CGPU_HIDDEN CUresult cgpu_reserve_or_error(int pos, int64_t bytes);

/* pools.c: give back what pools released at a synchronisation (or since the last look). */
CGPU_HIDDEN void cgpu_pools_settle(void);
/* pools.c: an allocation of pool `owner` (a cgpu_track owner) was freed, by cuMemFreeAsync or cuMemFree. */
CGPU_HIDDEN void cgpu_pool_freed(void *owner);

/* graphmem.c: an allocation node of bytes on CUDA device dev was captured on stream s. */
CGPU_HIDDEN void cgpu_graph_mem_captured(CUstream s, CUdevice dev, size_t bytes);
/* graphmem.c: the graph stream s is capturing into (NULL when none); forget graph g's memory nodes. */
CGPU_HIDDEN CUgraph cgpu_graph_mem_capture_graph(CUstream s);
CGPU_HIDDEN void cgpu_graph_mem_forget(CUgraph g);

#endif
