/* Asks cuGetProcAddress and cuGetProcAddress_v2, reached as applications reach them (dlopen + dlsym), for
 * each "name version flags" line on stdin, and prints what each returned pointer is:
 *
 *   name version flags v1=<library>:<symbol> v2=<library>:<symbol>
 *
 * (dladdr names the symbol; "-" when nothing was returned). tests/native/test_conformance.py feeds it
 * every combination cudaTypedefs.h maps to a hooked entry point, and checks libcgpu.so answers each. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>

#include "cuda_min.h"

typedef CUresult (*gpa1_t)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static void name_of(void *p, char *out, size_t n) {
    Dl_info info;
    if (!p) {
        snprintf(out, n, "-");
        return;
    }
    if (!dladdr(p, &info) || !info.dli_sname || !info.dli_fname) {
        snprintf(out, n, "?");
        return;
    }
    char file[512];
    snprintf(file, sizeof file, "%s", info.dli_fname);
    snprintf(out, n, "%s:%s", basename(file), info.dli_sname);
}

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "gpa_table: %s\n", dlerror());
        return 2;
    }
    gpa1_t v1 = (gpa1_t)dlsym(h, "cuGetProcAddress");
    gpa2_t v2 = (gpa2_t)dlsym(h, "cuGetProcAddress_v2");
    char symbol[256], a[600], b[600];
    int version;
    unsigned long long flags;
    while (scanf("%255s %d %llu", symbol, &version, &flags) == 3) {
        void *p1 = NULL, *p2 = NULL;
        CUdriverProcAddressQueryResult status;
        if (v1)
            v1(symbol, &p1, version, flags);
        if (v2)
            v2(symbol, &p2, version, flags, &status);
        name_of(p1, a, sizeof a);
        name_of(p2, b, sizeof b);
        printf("%s %d %llu v1=%s v2=%s\n", symbol, version, flags, a, b);
    }
    return 0;
}
