/* The container-side settings (behaviour §6 and CGPU_*), parsed as strictly as
 * libcgpu_client/env.py does: a malformed value is a one-line error naming the
 * variable, the value and what was expected. */
#ifndef CGPU_ENV_H
#define CGPU_ENV_H

#include <stdint.h>

#define CGPU_MAX_GPUS 16

typedef struct {
    int disabled;
    char socket[108];
    char instance[129]; /* "" when not declared */
    int ngpus;
    int gpu_index[CGPU_MAX_GPUS];  /* -1 when given as a UUID */
    char gpu_uuid[CGPU_MAX_GPUS][88];
    int weight;
    int core_percent; /* a GPU-core percentage (weight = core_percent / 5); 0: none */
    int core_limit;   /* the most GPU time (%) it asks to be held to, 5..100; 0: none stated */
    int highprio;
    int nmem;                       /* 0: no limit requested */
    int64_t memsize[CGPU_MAX_GPUS]; /* bytes per visible card */
    int on_loss_run;
    double idle_ms;
    char device[8];
    int native;
    int ncoll;           /* CGPU_COLLECTIVE_KERNELS: how many name parts; 0: none */
    char coll[8][64];    /* a kernel whose name contains one of these is a collective */
} cgpu_env;

/* Fill *out from getenv-like lookup `get`. Returns 0, or -1 with a one-line message in err. */
int cgpu_parse_env(const char *(*get)(const char *name), cgpu_env *out, char *err, int errlen);

#endif
