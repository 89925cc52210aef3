/* Test tool for libcgpu.so's pure parts, built from the shim's own sources.
 *
 *   codec_check roundtrip   read msgpack messages from stdin, parse each with mp_parse and
 *                           write it back with mp_w_node (the test compares both sides)
 *   codec_check env         parse the environment like the shim does; print the settings
 *                           as one line of key=value, or "error: MESSAGE" */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "env.h"
#include "mp.h"

static int roundtrip(void) {
    static uint8_t in[1 << 20], out[MP_MAX_MESSAGE];
    static mp_node nodes[8192];
    size_t len = fread(in, 1, sizeof in, stdin), off = 0;
    mp_arena arena = {nodes, 8192, 0};
    while (off < len) {
        mp_node *m;
        long k = mp_parse(in + off, len - off, &arena, &m);
        if (k <= 0) {
            fprintf(stderr, "codec_check: parse returned %ld at offset %zu\n", k, off);
            return 1;
        }
        mp_writer w;
        mp_writer_init(&w, out, sizeof out);
        mp_w_node(&w, m);
        if (w.err || fwrite(out, 1, w.len, stdout) != w.len)
            return 1;
        off += (size_t)k;
    }
    return 0;
}

static const char *get(const char *name) { return getenv(name); }

static int env(void) {
    cgpu_env e;
    char err[400];
    if (cgpu_parse_env(get, &e, err, sizeof err) < 0) {
        printf("error: %s\n", err);
        return 0;
    }
    printf("disabled=%d socket=%s instance=%s weight=%d core=%d highprio=%d on_loss=%s idle_ms=%g device=%s "
           "native=%d gpus=",
           e.disabled, e.socket, e.instance, e.weight, e.core_percent, e.highprio, e.on_loss_run ? "run" : "wait", e.idle_ms,
           e.device, e.native);
    for (int k = 0; k < e.ngpus; k++)
        printf(k ? ",%s" : "%s", e.gpu_index[k] >= 0 ? (sprintf(err, "%d", e.gpu_index[k]), err) : e.gpu_uuid[k]);
    printf(" memsize=");
    for (int k = 0; k < e.nmem; k++)
        printf(k ? ",%lld" : "%lld", (long long)e.memsize[k]);
    printf(" collectives=");
    for (int k = 0; k < e.ncoll; k++)
        printf(k ? ",%s" : "%s", e.coll[k]);
    printf("\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "roundtrip") == 0)
        return roundtrip();
    if (argc == 2 && strcmp(argv[1], "env") == 0)
        return env();
    fprintf(stderr, "usage: codec_check roundtrip|env\n");
    return 2;
}
