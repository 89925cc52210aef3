/* A small msgpack codec: exactly what the cgpu protocol (proto/PROTOCOL.md) needs.
 *
 * Writing appends to a fixed buffer and sets `err` instead of overflowing.
 * Reading parses one whole message into a tree of nodes held in a caller-owned
 * arena; it tells "incomplete, read more" apart from "malformed". */
#ifndef CGPU_MP_H
#define CGPU_MP_H

#include <stddef.h>
#include <stdint.h>

#define MP_MAX_MESSAGE 65536
#define MP_MAX_DEPTH 32

typedef struct {
    uint8_t *buf;
    size_t len, cap;
    int err; /* set when a write did not fit */
} mp_writer;

void mp_writer_init(mp_writer *w, uint8_t *buf, size_t cap);
void mp_w_nil(mp_writer *w);
void mp_w_bool(mp_writer *w, int v);
void mp_w_int(mp_writer *w, int64_t v);
void mp_w_uint(mp_writer *w, uint64_t v);
void mp_w_double(mp_writer *w, double v);
void mp_w_strn(mp_writer *w, const char *s, size_t n);
void mp_w_str(mp_writer *w, const char *s);
void mp_w_bin(mp_writer *w, const void *p, size_t n);
void mp_w_array(mp_writer *w, uint32_t n);
void mp_w_map(mp_writer *w, uint32_t n);

typedef enum { MP_NIL, MP_BOOL, MP_INT, MP_UINT, MP_FLOAT, MP_STR, MP_BIN, MP_ARRAY, MP_MAP } mp_type;

typedef struct mp_node {
    mp_type type;
    uint32_t n; /* string/bin length, array items, map pairs */
    union {
        int64_t i;  /* MP_INT, MP_BOOL */
        uint64_t u; /* MP_UINT */
        double f;
        const char *s;        /* MP_STR, MP_BIN: points into the input */
        struct mp_node *kids; /* MP_ARRAY: n items; MP_MAP: 2n (key, value) */
    } v;
} mp_node;

typedef struct {
    mp_node *nodes;
    size_t cap, used;
} mp_arena;

/* Parse one message from buf[0..len). Returns the bytes it used, 0 when the message
 * is not complete yet, -1 when the bytes are not valid msgpack (or too deep, too many
 * nodes for the arena). *out points into the arena and into buf. */
long mp_parse(const uint8_t *buf, size_t len, mp_arena *arena, mp_node **out);

/* Lookups on a parsed map; NULL / -1 when absent or of another type. */
const mp_node *mp_get(const mp_node *map, const char *key);
int mp_get_i64(const mp_node *map, const char *key, int64_t *out);
int mp_str_is(const mp_node *node, const char *s);
int mp_as_i64(const mp_node *node, int64_t *out);

/* Write a parsed node back out (the codec test round-trips every message through this). */
void mp_w_node(mp_writer *w, const mp_node *node);

#endif
