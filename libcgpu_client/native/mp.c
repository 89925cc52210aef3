/* msgpack codec for the cgpu protocol; see mp.h. */
#include "mp.h"

#include <string.h>

void mp_writer_init(mp_writer *w, uint8_t *buf, size_t cap) {
    w->buf = buf;
    w->len = 0;
    w->cap = cap;
    w->err = 0;
}

static void put(mp_writer *w, const void *p, size_t n) {
    if (w->err || w->cap - w->len < n) {
        w->err = 1;
        return;
    }
    memcpy(w->buf + w->len, p, n);
    w->len += n;
}

static void put_be(mp_writer *w, uint8_t tag, uint64_t v, int bytes) {
    uint8_t b[9];
    b[0] = tag;
    for (int i = 0; i < bytes; i++)
        b[1 + i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
    put(w, b, (size_t)bytes + 1);
}

void mp_w_nil(mp_writer *w) { put_be(w, 0xc0, 0, 0); }
void mp_w_bool(mp_writer *w, int v) { put_be(w, v ? 0xc3 : 0xc2, 0, 0); }

void mp_w_uint(mp_writer *w, uint64_t v) {
    if (v < 0x80)
        put_be(w, (uint8_t)v, 0, 0);
    else if (v <= 0xff)
        put_be(w, 0xcc, v, 1);
    else if (v <= 0xffff)
        put_be(w, 0xcd, v, 2);
    else if (v <= 0xffffffffULL)
        put_be(w, 0xce, v, 4);
    else
        put_be(w, 0xcf, v, 8);
}

void mp_w_int(mp_writer *w, int64_t v) {
    if (v >= 0)
        mp_w_uint(w, (uint64_t)v);
    else if (v >= -32)
        put_be(w, (uint8_t)(int8_t)v, 0, 0);
    else if (v >= INT8_MIN)
        put_be(w, 0xd0, (uint8_t)(int8_t)v, 1);
    else if (v >= INT16_MIN)
        put_be(w, 0xd1, (uint16_t)(int16_t)v, 2);
    else if (v >= INT32_MIN)
        put_be(w, 0xd2, (uint32_t)(int32_t)v, 4);
    else
        put_be(w, 0xd3, (uint64_t)v, 8);
}

void mp_w_double(mp_writer *w, double v) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    put_be(w, 0xcb, bits, 8);
}

void mp_w_strn(mp_writer *w, const char *s, size_t n) {
    if (n < 32)
        put_be(w, (uint8_t)(0xa0 | n), 0, 0);
    else if (n <= 0xff)
        put_be(w, 0xd9, n, 1);
    else if (n <= 0xffff)
        put_be(w, 0xda, n, 2);
    else
        put_be(w, 0xdb, n, 4);
    put(w, s, n);
}

void mp_w_str(mp_writer *w, const char *s) { mp_w_strn(w, s, strlen(s)); }

void mp_w_bin(mp_writer *w, const void *p, size_t n) {
    if (n <= 0xff)
        put_be(w, 0xc4, n, 1);
    else if (n <= 0xffff)
        put_be(w, 0xc5, n, 2);
    else
        put_be(w, 0xc6, n, 4);
    put(w, p, n);
}

void mp_w_array(mp_writer *w, uint32_t n) {
    if (n < 16)
        put_be(w, (uint8_t)(0x90 | n), 0, 0);
    else if (n <= 0xffff)
        put_be(w, 0xdc, n, 2);
    else
        put_be(w, 0xdd, n, 4);
}

void mp_w_map(mp_writer *w, uint32_t n) {
    if (n < 16)
        put_be(w, (uint8_t)(0x80 | n), 0, 0);
    else if (n <= 0xffff)
        put_be(w, 0xde, n, 2);
    else
        put_be(w, 0xdf, n, 4);
}

void mp_w_node(mp_writer *w, const mp_node *x) {
    switch (x->type) {
    case MP_NIL: mp_w_nil(w); break;
    case MP_BOOL: mp_w_bool(w, (int)x->v.i); break;
    case MP_INT: mp_w_int(w, x->v.i); break;
    case MP_UINT: mp_w_uint(w, x->v.u); break;
    case MP_FLOAT: mp_w_double(w, x->v.f); break;
    case MP_STR: mp_w_strn(w, x->v.s, x->n); break;
    case MP_BIN: mp_w_bin(w, x->v.s, x->n); break;
    case MP_ARRAY:
        mp_w_array(w, x->n);
        for (uint32_t k = 0; k < x->n; k++)
            mp_w_node(w, &x->v.kids[k]);
        break;
    case MP_MAP:
        mp_w_map(w, x->n);
        for (uint32_t k = 0; k < 2 * x->n; k++)
            mp_w_node(w, &x->v.kids[k]);
        break;
    }
}

/* ------------------------------------------------------------------ reading */

typedef struct {
    const uint8_t *p, *end;
    mp_arena *a;
    int incomplete, bad;
} rd;

static int need(rd *r, size_t n) {
    if ((size_t)(r->end - r->p) < n) {
        r->incomplete = 1;
        return 0;
    }
    return 1;
}

static uint64_t be(rd *r, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v = (v << 8) | r->p[i];
    r->p += bytes;
    return v;
}

static mp_node *alloc_nodes(rd *r, uint64_t n) {
    if (n > r->a->cap - r->a->used) {
        r->bad = 1;
        return NULL;
    }
    mp_node *k = r->a->nodes + r->a->used;
    r->a->used += (size_t)n;
    return k;
}

static void parse_node(rd *r, mp_node *x, int depth);

static void parse_seq(rd *r, mp_node *x, mp_type t, uint64_t n, int depth) {
    x->type = t;
    x->n = (uint32_t)n;
    uint64_t items = t == MP_MAP ? 2 * n : n;
    /* every item takes at least one byte: refuse counts the input cannot hold */
    if (items > (uint64_t)(r->end - r->p)) {
        r->incomplete = 1;
        return;
    }
    x->v.kids = alloc_nodes(r, items);
    for (uint64_t k = 0; x->v.kids && k < items && !r->incomplete && !r->bad; k++)
        parse_node(r, &x->v.kids[k], depth + 1);
}

static void parse_raw(rd *r, mp_node *x, mp_type t, uint64_t n) {
    if (!need(r, (size_t)n))
        return;
    x->type = t;
    x->n = (uint32_t)n;
    x->v.s = (const char *)r->p;
    r->p += n;
}

static void parse_node(rd *r, mp_node *x, int depth) {
    if (depth > MP_MAX_DEPTH) {
        r->bad = 1;
        return;
    }
    if (!need(r, 1))
        return;
    uint8_t tag = *r->p++;
    static const int width[] = {1, 2, 4, 8};
    if (tag <= 0x7f) {
        x->type = MP_UINT;
        x->v.u = tag;
    } else if (tag >= 0xe0) {
        x->type = MP_INT;
        x->v.i = (int8_t)tag;
    } else if (tag >= 0xa0 && tag <= 0xbf) {
        parse_raw(r, x, MP_STR, tag & 0x1f);
    } else if (tag >= 0x90 && tag <= 0x9f) {
        parse_seq(r, x, MP_ARRAY, tag & 0x0f, depth);
    } else if (tag >= 0x80 && tag <= 0x8f) {
        parse_seq(r, x, MP_MAP, tag & 0x0f, depth);
    } else if (tag == 0xc0) {
        x->type = MP_NIL;
    } else if (tag == 0xc2 || tag == 0xc3) {
        x->type = MP_BOOL;
        x->v.i = tag == 0xc3;
    } else if (tag >= 0xcc && tag <= 0xcf) {
        int b = width[tag - 0xcc];
        if (!need(r, (size_t)b))
            return;
        x->type = MP_UINT;
        x->v.u = be(r, b);
    } else if (tag >= 0xd0 && tag <= 0xd3) {
        int b = width[tag - 0xd0];
        if (!need(r, (size_t)b))
            return;
        uint64_t u = be(r, b);
        x->type = MP_INT;
        x->v.i = b == 1 ? (int8_t)u : b == 2 ? (int16_t)u : b == 4 ? (int32_t)u : (int64_t)u;
    } else if (tag == 0xca || tag == 0xcb) {
        int b = tag == 0xca ? 4 : 8;
        if (!need(r, (size_t)b))
            return;
        uint64_t u = be(r, b);
        x->type = MP_FLOAT;
        if (b == 4) {
            uint32_t u32 = (uint32_t)u;
            float f;
            memcpy(&f, &u32, sizeof f);
            x->v.f = f;
        } else {
            memcpy(&x->v.f, &u, sizeof x->v.f);
        }
    } else if (tag >= 0xd9 && tag <= 0xdb) {
        int b = width[tag - 0xd9];
        if (!need(r, (size_t)b))
            return;
        parse_raw(r, x, MP_STR, be(r, b));
    } else if (tag >= 0xc4 && tag <= 0xc6) {
        int b = width[tag - 0xc4];
        if (!need(r, (size_t)b))
            return;
        parse_raw(r, x, MP_BIN, be(r, b));
    } else if (tag == 0xdc || tag == 0xdd || tag == 0xde || tag == 0xdf) {
        int b = (tag == 0xdc || tag == 0xde) ? 2 : 4;
        if (!need(r, (size_t)b))
            return;
        parse_seq(r, x, tag <= 0xdd ? MP_ARRAY : MP_MAP, be(r, b), depth);
    } else {
        r->bad = 1; /* 0xc1 (never used) and the ext types: not in this protocol */
    }
}

long mp_parse(const uint8_t *buf, size_t len, mp_arena *arena, mp_node **out) {
    rd r = {buf, buf + len, arena, 0, 0};
    arena->used = 0;
    mp_node *root = alloc_nodes(&r, 1);
    if (!root)
        return -1;
    parse_node(&r, root, 0);
    if (r.bad)
        return -1;
    if (r.incomplete)
        return len >= MP_MAX_MESSAGE ? -1 : 0;
    *out = root;
    return (long)(r.p - buf);
}

int mp_str_is(const mp_node *x, const char *s) {
    size_t n = strlen(s);
    return x && x->type == MP_STR && x->n == n && memcmp(x->v.s, s, n) == 0;
}

const mp_node *mp_get(const mp_node *map, const char *key) {
    if (!map || map->type != MP_MAP)
        return NULL;
    for (uint32_t k = 0; k < map->n; k++)
        if (mp_str_is(&map->v.kids[2 * k], key))
            return &map->v.kids[2 * k + 1];
    return NULL;
}

int mp_as_i64(const mp_node *x, int64_t *out) {
    if (!x)
        return -1;
    if (x->type == MP_INT) {
        *out = x->v.i;
        return 0;
    }
    if (x->type == MP_UINT && x->v.u <= INT64_MAX) {
        *out = (int64_t)x->v.u;
        return 0;
    }
    return -1;
}

int mp_get_i64(const mp_node *map, const char *key, int64_t *out) { return mp_as_i64(mp_get(map, key), out); }
