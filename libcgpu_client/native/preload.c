/* libcgpu.so's start-up: parse the environment (a malformed value stops the program with one
 * line, as the Python client does), hand the gates the driver's context operations, and start
 * afresh in a forked child. The connection starts at cuInit (in the background: cuInit does not wait
 * for the daemon), so that the daemon counts the process as its client from before its context exists:
 * its containment takes a GPU process that is no client for one that goes around cgpu. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <unistd.h>

#include "hooks.h"

EXPORT const char cgpu_shim_version[] = "0.1";

static const char *env_get(const char *name) { return getenv(name); }

__attribute__((constructor)) static void cgpu_shim_init(void) {
    char err[400];
    if (cgpu_parse_env(env_get, &cgpu_cfg, err, sizeof err) < 0) {
        cgpu_log("%s", err);
        _exit(2);
    }
    cgpu_env_ok = !cgpu_cfg.disabled;
    static const cgpu_device_ops ops = {cgpu_sync_context, cgpu_current_context};
    cgpu_gates_init(&ops);
    pthread_atfork(NULL, NULL, cgpu_gates_after_fork);
}

CUresult cuInit(unsigned int flags) {
    REAL_OR_FAIL(cuInit);
    CUresult r = real(flags);
    if (r == CUDA_SUCCESS && cgpu_env_ok)
        cgpu_start();
    return r;
}
