/*
 * safetensors.c - the safetensors format as its reference implementation defines it:
 * u64 little-endian header length N, N bytes of JSON (an object of tensors and an
 * optional "__metadata__" map of strings), then the data section. Every tensor's
 * byte range [begin, end) is relative to the data section; sorted by begin they must
 * tile it exactly from 0 to its end. All of it is checked before a tensor is handed out.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"

static const struct {
    const char *name;
    size_t size;
} dtypes[KILN_DTYPE_COUNT] = {
    [KILN_F32] = {"F32", 4},  [KILN_F16] = {"F16", 2}, [KILN_BF16] = {"BF16", 2},
    [KILN_F64] = {"F64", 8},  [KILN_I8] = {"I8", 1},   [KILN_I16] = {"I16", 2},
    [KILN_I32] = {"I32", 4},  [KILN_I64] = {"I64", 8}, [KILN_U8] = {"U8", 1},
    [KILN_U16] = {"U16", 2},  [KILN_U32] = {"U32", 4}, [KILN_U64] = {"U64", 8},
    [KILN_BOOL] = {"BOOL", 1},
};

const char *kiln_dtype_name(kiln_dtype dt) {
    return (unsigned)dt < KILN_DTYPE_COUNT ? dtypes[dt].name : "?";
}

size_t kiln_dtype_size(kiln_dtype dt) { return (unsigned)dt < KILN_DTYPE_COUNT ? dtypes[dt].size : 0; }

bool kiln_dtype_parse(const char *name, kiln_dtype *out) {
    for (int i = 0; i < KILN_DTYPE_COUNT; i++)
        if (strcmp(dtypes[i].name, name) == 0) {
            *out = (kiln_dtype)i;
            return true;
        }
    return false;
}

struct kiln_st {
    char *path;
    unsigned char *base; /* whole file */
    size_t len;
    bool mapped;
    size_t n;
    kiln_tensor *t;     /* sorted by name */
    size_t nmeta;
    char **meta;        /* key, value pairs, sorted by key */
};

void kiln_st_close(kiln_st *st) {
    if (!st) return;
    if (st->base) {
        if (st->mapped) munmap(st->base, st->len);
        else free(st->base);
    }
    for (size_t i = 0; i < st->n; i++) free((char *)st->t[i].name);
    free(st->t);
    for (size_t i = 0; i < 2 * st->nmeta; i++) free(st->meta[i]);
    free(st->meta);
    free(st->path);
    free(st);
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const kiln_tensor *)a)->name, ((const kiln_tensor *)b)->name);
}

static int cmp_by_begin(const void *a, const void *b) {
    const kiln_tensor *x = *(const kiln_tensor *const *)a, *y = *(const kiln_tensor *const *)b;
    if (x->data != y->data) return (const char *)x->data < (const char *)y->data ? -1 : 1;
    /* Equal begins: the empty tensor first, so a zero-length tensor may share an offset. */
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static int cmp_meta(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* JSON integer that fits in [0, 2^53): jansson keeps integers as json_int_t. */
static bool json_uint(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v)) return false;
    json_int_t i = json_integer_value(v);
    if (i < 0) return false;
    *out = (uint64_t)i;
    return true;
}

static kiln_err parse_tensor(kiln_st *st, const char *name, const json_t *v, size_t datalen,
                             kiln_tensor *t) {
    const char *p = st->path;
    KILN_FAIL_IF(!json_is_object(v), KILN_ERR_FORMAT, "'%s': tensor '%s': entry is not an object", p, name);
    const char *key;
    const json_t *field;
    json_object_foreach((json_t *)v, key, field) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return kiln_fail(KILN_ERR_FORMAT, "'%s': tensor '%s': unknown field '%s'", p, name, key);
    }
    const json_t *dt = json_object_get(v, "dtype");
    KILN_FAIL_IF(!json_is_string(dt), KILN_ERR_FORMAT, "'%s': tensor '%s': missing or non-string dtype", p, name);
    KILN_FAIL_IF(!kiln_dtype_parse(json_string_value(dt), &t->dtype), KILN_ERR_FORMAT,
                 "'%s': tensor '%s': unknown dtype '%s'", p, name, json_string_value(dt));
    const json_t *shape = json_object_get(v, "shape");
    KILN_FAIL_IF(!json_is_array(shape), KILN_ERR_FORMAT, "'%s': tensor '%s': missing or non-array shape", p, name);
    KILN_FAIL_IF(json_array_size(shape) > KILN_ST_MAX_DIMS, KILN_ERR_FORMAT,
                 "'%s': tensor '%s': %zu dimensions, at most %d supported", p, name,
                 json_array_size(shape), KILN_ST_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    size_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        uint64_t dim;
        KILN_FAIL_IF(!json_uint(json_array_get(shape, (size_t)d), &dim), KILN_ERR_FORMAT,
                     "'%s': tensor '%s': shape entry %d is not a non-negative integer", p, name, d);
        t->shape[d] = (int64_t)dim;
        KILN_FAIL_IF(!kiln_mul_ok(numel, (size_t)dim, &numel), KILN_ERR_FORMAT,
                     "'%s': tensor '%s': element count overflows", p, name);
    }
    t->numel = numel;
    size_t nbytes;
    KILN_FAIL_IF(!kiln_mul_ok(numel, kiln_dtype_size(t->dtype), &nbytes), KILN_ERR_FORMAT,
                 "'%s': tensor '%s': byte length overflows", p, name);
    const json_t *off = json_object_get(v, "data_offsets");
    uint64_t b, e;
    KILN_FAIL_IF(!json_is_array(off) || json_array_size(off) != 2 ||
                     !json_uint(json_array_get(off, 0), &b) || !json_uint(json_array_get(off, 1), &e),
                 KILN_ERR_FORMAT, "'%s': tensor '%s': data_offsets must be two non-negative integers", p, name);
    KILN_FAIL_IF(e < b, KILN_ERR_FORMAT, "'%s': tensor '%s': data_offsets end %llu is before begin %llu",
                 p, name, (unsigned long long)e, (unsigned long long)b);
    KILN_FAIL_IF(e > datalen, KILN_ERR_FORMAT,
                 "'%s': tensor '%s': data_offsets [%llu, %llu) out of range of the %zu-byte data section",
                 p, name, (unsigned long long)b, (unsigned long long)e, datalen);
    KILN_FAIL_IF(e - b != nbytes, KILN_ERR_FORMAT,
                 "'%s': tensor '%s': %llu bytes in data_offsets, but shape and dtype %s need %zu", p,
                 name, (unsigned long long)(e - b), kiln_dtype_name(t->dtype), nbytes);
    t->nbytes = nbytes;
    t->data = (const void *)(uintptr_t)b; /* relative for now: made absolute after the tiling check */
    return KILN_OK;
}

static kiln_err parse_meta(kiln_st *st, const json_t *m) {
    KILN_FAIL_IF(!json_is_object(m), KILN_ERR_FORMAT, "'%s': __metadata__ is not an object", st->path);
    st->meta = kiln_calloc(2 * json_object_size(m) + 1, sizeof(char *));
    if (!st->meta) return KILN_ERR_NOMEM;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)m, key, v) {
        KILN_FAIL_IF(!json_is_string(v), KILN_ERR_FORMAT,
                     "'%s': __metadata__ value of '%s' is not a string", st->path, key);
        st->meta[2 * st->nmeta] = kiln_strdup(key);
        st->meta[2 * st->nmeta + 1] = kiln_strdup(json_string_value(v));
        st->nmeta++;
        if (!st->meta[2 * st->nmeta - 2] || !st->meta[2 * st->nmeta - 1]) return KILN_ERR_NOMEM;
    }
    qsort(st->meta, st->nmeta, 2 * sizeof(char *), cmp_meta);
    return KILN_OK;
}

/* A file that begins with a line of text (its first 8 bytes, which a safetensors file holds as
 * a header length, printable) is named for what it is: a CSV passed where a dataset goes
 * said "header length 8317701201201488228 exceeds ..." (issue 30). KILN_ERR_FORMAT with that
 * message; KILN_OK when the file does not begin with a line of text. */
static kiln_err text_file(const kiln_st *st) {
    const unsigned char *b = st->base;
    size_t n = 0;
    while (n < st->len && n < 4096 && b[n] != '\n' && b[n] != '\r') {
        if (b[n] < 0x20 && b[n] != '\t') return KILN_OK;
        if (b[n] == 0x7f) return KILN_OK;
        n++;
    }
    if (n < 8) return KILN_OK;
    const size_t line = n;
    bool csv = memchr(b, ',', line) || memchr(b, ';', line) || memchr(b, '\t', line);
    char head[48];
    size_t k = 0;
    for (size_t i = 0; i < line && k + 4 < sizeof head; i++)
        head[k++] = b[i] == '\t' ? ' ' : (char)b[i];
    if (line > k) head[k - 3] = head[k - 2] = head[k - 1] = '.';
    head[k] = 0;
    if (csv)
        return kiln_fail(KILN_ERR_FORMAT,
                         "'%s' is a CSV file, not a dataset or model (safetensors)\nit begins "
                         "\"%s\"; a CSV becomes a dataset with kiln data import --csv '%s' "
                         "--features ... --targets ... --out DATA (docs/data.md)",
                         st->path, head, st->path);
    return kiln_fail(KILN_ERR_FORMAT,
                     "'%s' is a text file, not a dataset or model (safetensors)\nit begins \"%s\"",
                     st->path, head);
}

/* Validate st->base[0..len) and fill the tables. */
static kiln_err parse(kiln_st *st) {
    const char *p = st->path;
    KILN_FAIL_IF(st->len < 8, KILN_ERR_FORMAT, "'%s': %zu bytes, too short for a safetensors header", p, st->len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | st->base[i];
    if (hlen > KILN_ST_MAX_HEADER) KILN_TRY(text_file(st));
    KILN_FAIL_IF(hlen > KILN_ST_MAX_HEADER, KILN_ERR_FORMAT,
                 "'%s': header length %llu exceeds the %u-byte limit", p, (unsigned long long)hlen,
                 KILN_ST_MAX_HEADER);
    KILN_FAIL_IF(hlen > st->len - 8, KILN_ERR_FORMAT,
                 "'%s': header length %llu runs past the end of the %zu-byte file (truncated?)", p,
                 (unsigned long long)hlen, st->len);
    KILN_FAIL_IF(hlen < 2 || st->base[8] != '{', KILN_ERR_FORMAT, "'%s': header is not a JSON object", p);
    json_t *h;
    json_error_t je;
    h = json_loadb((const char *)st->base + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!h) {
        if (strstr(je.text, "duplicate"))
            return kiln_fail(KILN_ERR_FORMAT, "'%s': duplicate tensor name in header: %s", p, je.text);
        return kiln_fail(KILN_ERR_FORMAT, "'%s': header is not valid JSON (column %d): %s", p,
                         je.column, je.text);
    }
    kiln_err rc = KILN_OK;
    kiln_tensor **order = NULL;
    KILN_CHECK_IF(rc, out, !json_is_object(h), KILN_ERR_FORMAT, "'%s': header is not a JSON object", p);
    size_t datalen = st->len - 8 - (size_t)hlen;
    size_t n = json_object_size(h);
    st->t = kiln_calloc(n + 1, sizeof *st->t);
    order = kiln_calloc(n + 1, sizeof *order);
    KILN_CHECK_IF(rc, out, !st->t || !order, KILN_ERR_NOMEM, "out of memory reading '%s'", p);
    const char *key;
    json_t *v;
    json_object_foreach(h, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            KILN_CHECK(rc, out, parse_meta(st, v));
            continue;
        }
        kiln_tensor *t = &st->t[st->n];
        KILN_CHECK(rc, out, parse_tensor(st, key, v, datalen, t));
        t->name = kiln_strdup(key);
        KILN_CHECK_IF(rc, out, !t->name, KILN_ERR_NOMEM, "out of memory reading '%s'", p);
        order[st->n] = t;
        st->n++;
    }
    /* Tiling: sorted by begin, each starts where the previous ended, the last ends at datalen. */
    qsort(order, st->n, sizeof *order, cmp_by_begin);
    size_t pos = 0;
    for (size_t i = 0; i < st->n; i++) {
        size_t b = (size_t)(uintptr_t)order[i]->data;
        KILN_CHECK_IF(rc, out, b > pos, KILN_ERR_FORMAT,
                      "'%s': tensor '%s': gap in the data section before offset %zu (previous data ends at %zu)",
                      p, order[i]->name, b, pos);
        KILN_CHECK_IF(rc, out, b < pos, KILN_ERR_FORMAT,
                      "'%s': tensor '%s': data_offsets begin %zu overlaps the previous tensor (which ends at %zu)",
                      p, order[i]->name, b, pos);
        pos = b + order[i]->nbytes;
    }
    KILN_CHECK_IF(rc, out, pos != datalen, KILN_ERR_FORMAT,
                  "'%s': tensors cover %zu bytes but the data section holds %zu (truncated or trailing bytes)",
                  p, pos, datalen);
    const unsigned char *data = st->base + 8 + hlen;
    for (size_t i = 0; i < st->n; i++) st->t[i].data = data + (uintptr_t)st->t[i].data;
    qsort(st->t, st->n, sizeof *st->t, cmp_tensor_name);
out:
    free(order);
    json_decref(h);
    return rc;
}

kiln_err kiln_st_open(const char *path, kiln_st **out) {
    *out = NULL;
    kiln_st *st = kiln_calloc(1, sizeof *st);
    if (!st) return KILN_ERR_NOMEM;
    st->path = kiln_strdup(path);
    if (!st->path) {
        free(st);
        return KILN_ERR_NOMEM;
    }
    kiln_err rc = KILN_OK;
    int fd = -1;
    uint64_t size;
    KILN_CHECK(rc, fail, kiln_open_input(path, &fd, &size));
    KILN_CHECK_IF(rc, fail, size > SIZE_MAX, KILN_ERR_LIMIT, "'%s' is too large to map", path);
    st->len = (size_t)size;
    if (st->len > 0) {
        void *m = mmap(NULL, st->len, PROT_READ, MAP_PRIVATE, fd, 0);
        KILN_CHECK_IF(rc, fail, m == MAP_FAILED, KILN_ERR_IO, "cannot map '%s': %s", path, strerror(errno));
        st->base = m;
        st->mapped = true;
    }
    close(fd);
    fd = -1;
    KILN_CHECK(rc, fail, parse(st));
    *out = st;
    return KILN_OK;
fail:
    if (fd >= 0) close(fd);
    kiln_st_close(st);
    return rc;
}

kiln_err kiln_st_parse(const void *buf, size_t len, const char *label, kiln_st **out) {
    *out = NULL;
    kiln_st *st = kiln_calloc(1, sizeof *st);
    if (!st) return KILN_ERR_NOMEM;
    st->path = kiln_strdup(label);
    st->base = kiln_malloc(len);
    if (!st->path || !st->base) {
        kiln_st_close(st);
        return KILN_ERR_NOMEM;
    }
    memcpy(st->base, buf, len);
    st->len = len;
    kiln_err rc = parse(st);
    if (rc) {
        kiln_st_close(st);
        return rc;
    }
    *out = st;
    return KILN_OK;
}

size_t kiln_st_count(const kiln_st *st) { return st->n; }
const kiln_tensor *kiln_st_at(const kiln_st *st, size_t i) { return i < st->n ? &st->t[i] : NULL; }
const char *kiln_st_path(const kiln_st *st) { return st->path; }
size_t kiln_st_meta_count(const kiln_st *st) { return st->nmeta; }

void kiln_st_meta_at(const kiln_st *st, size_t i, const char **key, const char **value) {
    *key = st->meta[2 * i];
    *value = st->meta[2 * i + 1];
}

const kiln_tensor *kiln_st_find(const kiln_st *st, const char *name) {
    kiln_tensor key = {.name = name};
    return bsearch(&key, st->t, st->n, sizeof *st->t, cmp_tensor_name);
}

const char *kiln_st_meta(const kiln_st *st, const char *key) {
    for (size_t i = 0; i < st->nmeta; i++)
        if (strcmp(st->meta[2 * i], key) == 0) return st->meta[2 * i + 1];
    return NULL;
}

kiln_err kiln_st_expect(const kiln_st *st, const char *name, kiln_dtype dt, int ndim,
                        const int64_t *shape, const kiln_tensor **out) {
    const kiln_tensor *t = kiln_st_find(st, name);
    KILN_FAIL_IF(!t, KILN_ERR_FORMAT, "'%s': tensor '%s' is missing", st->path, name);
    KILN_FAIL_IF(t->dtype != dt, KILN_ERR_FORMAT, "'%s': tensor '%s' is %s, expected %s", st->path,
                 name, kiln_dtype_name(t->dtype), kiln_dtype_name(dt));
    bool ok = t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = shape[d] < 0 || shape[d] == t->shape[d];
    if (!ok) {
        char got[128] = "", want[128] = "";
        size_t g = 0, w = 0;
        for (int d = 0; d < t->ndim && g < sizeof got - 24; d++)
            g += (size_t)snprintf(got + g, sizeof got - g, d ? ",%lld" : "%lld", (long long)t->shape[d]);
        for (int d = 0; d < ndim && w < sizeof want - 24; d++)
            w += (size_t)snprintf(want + w, sizeof want - w, d ? ",%lld" : "%lld", (long long)shape[d]);
        return kiln_fail(KILN_ERR_FORMAT, "'%s': tensor '%s' has shape [%s], expected [%s]", st->path,
                         name, got, want);
    }
    if (out) *out = t;
    return KILN_OK;
}

uint16_t kiln_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float kiln_bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float kiln_f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
    float f;
    if (e == 0) {
        f = ldexpf((float)m, -24);
        return s ? -f : f;
    }
    uint32_t u = e == 31 ? (s | 0x7f800000u | m << 13) : (s | (e + 112) << 23 | m << 13);
    memcpy(&f, &u, 4);
    return f;
}

kiln_err kiln_tensor_to_f32(const kiln_tensor *t, float *dst) {
    const unsigned char *p = t->data;
    for (size_t i = 0; i < t->numel; i++) {
        switch (t->dtype) {
        case KILN_F32: memcpy(&dst[i], p + 4 * i, 4); break;
        case KILN_F64: {
            double d;
            memcpy(&d, p + 8 * i, 8);
            dst[i] = (float)d;
            break;
        }
        case KILN_BF16: {
            uint16_t b;
            memcpy(&b, p + 2 * i, 2);
            dst[i] = kiln_bf16_to_f32(b);
            break;
        }
        case KILN_F16: {
            uint16_t b;
            memcpy(&b, p + 2 * i, 2);
            dst[i] = kiln_f16_to_f32(b);
            break;
        }
        default:
            return kiln_fail(KILN_ERR_FORMAT, "tensor '%s' is %s, not a floating-point type", t->name,
                             kiln_dtype_name(t->dtype));
        }
    }
    return KILN_OK;
}

/* ---- writer ---- */

typedef struct {
    char *name;
    kiln_dtype dtype;
    int ndim;
    int64_t shape[KILN_ST_MAX_DIMS];
    const void *data;
    size_t nbytes;
} wentry;

struct kiln_st_writer {
    wentry *e;
    size_t n, cap;
    json_t *meta;
};

kiln_err kiln_st_writer_new(kiln_st_writer **out) {
    *out = kiln_calloc(1, sizeof **out);
    if (!*out) return KILN_ERR_NOMEM;
    (*out)->meta = json_object();
    if (!(*out)->meta) {
        free(*out);
        *out = NULL;
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    return KILN_OK;
}

void kiln_st_writer_free(kiln_st_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n; i++) free(w->e[i].name);
    free(w->e);
    json_decref(w->meta);
    free(w);
}

kiln_err kiln_st_writer_add(kiln_st_writer *w, const char *name, kiln_dtype dt, int ndim,
                            const int64_t *shape, const void *data) {
    KILN_FAIL_IF(ndim < 0 || ndim > KILN_ST_MAX_DIMS, KILN_ERR_USAGE, "tensor '%s': bad rank %d", name, ndim);
    KILN_FAIL_IF(strcmp(name, "__metadata__") == 0 || !*name, KILN_ERR_USAGE, "invalid tensor name '%s'", name);
    for (size_t i = 0; i < w->n; i++)
        KILN_FAIL_IF(strcmp(w->e[i].name, name) == 0, KILN_ERR_USAGE, "duplicate tensor name '%s'", name);
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 16;
        wentry *e = realloc(w->e, cap * sizeof *e);
        if (!e) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
        w->e = e;
        w->cap = cap;
    }
    wentry *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    size_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        KILN_FAIL_IF(shape[d] < 0, KILN_ERR_USAGE, "tensor '%s': negative dimension", name);
        KILN_FAIL_IF(!kiln_mul_ok(numel, (size_t)shape[d], &numel), KILN_ERR_USAGE, "tensor '%s': too large", name);
        e->shape[d] = shape[d];
    }
    KILN_FAIL_IF(!kiln_mul_ok(numel, kiln_dtype_size(dt), &e->nbytes), KILN_ERR_USAGE, "tensor '%s': too large", name);
    e->name = kiln_strdup(name);
    if (!e->name) return KILN_ERR_NOMEM;
    e->dtype = dt;
    e->ndim = ndim;
    e->data = data;
    w->n++;
    return KILN_OK;
}

kiln_err kiln_st_writer_meta(kiln_st_writer *w, const char *key, const char *value) {
    KILN_FAIL_IF(json_object_get(w->meta, key), KILN_ERR_USAGE, "duplicate metadata key '%s'", key);
    KILN_FAIL_IF(json_object_set_new(w->meta, key, json_string(value)) != 0, KILN_ERR_USAGE,
                 "metadata '%s' is not valid UTF-8", key);
    return KILN_OK;
}

static int cmp_wentry(const void *a, const void *b) {
    return strcmp(((const wentry *)a)->name, ((const wentry *)b)->name);
}

kiln_err kiln_st_writer_write(kiln_st_writer *w, const char *path) {
    qsort(w->e, w->n, sizeof *w->e, cmp_wentry);
    json_t *h = json_object();
    if (!h) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_err rc = KILN_OK;
    char *text = NULL;
    if (json_object_size(w->meta)) json_object_set(h, "__metadata__", w->meta);
    size_t off = 0;
    for (size_t i = 0; i < w->n; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < w->e[i].ndim; d++) json_array_append_new(shape, json_integer(w->e[i].shape[d]));
        json_t *t = json_pack("{s:s,s:o,s:[I,I]}", "dtype", kiln_dtype_name(w->e[i].dtype), "shape",
                              shape, "data_offsets", (json_int_t)off, (json_int_t)(off + w->e[i].nbytes));
        KILN_CHECK_IF(rc, out, !t || json_object_set_new(h, w->e[i].name, t), KILN_ERR_NOMEM,
                      "out of memory writing '%s'", path);
        off += w->e[i].nbytes;
    }
    /* Metadata keys sorted, tensors in name order (insertion order preserved). */
    json_t *meta = json_object_get(h, "__metadata__");
    char *mtext = meta ? json_dumps(meta, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_object_del(h, "__metadata__");
    char *ttext = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    KILN_CHECK_IF(rc, out, !ttext || (meta && !mtext), KILN_ERR_NOMEM, "out of memory writing '%s'", path);
    /* "{" + "\"__metadata__\":" + meta + ("," if tensors) + rest of the tensor object */
    const char *rest = ttext + 1; /* after '{' */
    bool has_t = w->n > 0;
    text = mtext ? kiln_asprintf("{\"__metadata__\":%s%s%s", mtext, has_t ? "," : "}", has_t ? rest : "")
                 : kiln_strdup(ttext);
    free(mtext);
    free(ttext);
    KILN_CHECK_IF(rc, out, !text, KILN_ERR_NOMEM, "out of memory writing '%s'", path);
    size_t hl = strlen(text), padded = (hl + 7) & ~(size_t)7;
    char *hdr = kiln_malloc(8 + padded);
    KILN_CHECK_IF(rc, out, !hdr, KILN_ERR_NOMEM, "out of memory writing '%s'", path);
    for (int i = 0; i < 8; i++) hdr[i] = (char)((uint64_t)padded >> (8 * i));
    memcpy(hdr + 8, text, hl);
    memset(hdr + 8 + hl, ' ', padded - hl);
    kiln_atomic a;
    rc = kiln_atomic_begin(&a, path);
    if (!rc) rc = kiln_atomic_write(&a, hdr, 8 + padded);
    free(hdr);
    for (size_t i = 0; !rc && i < w->n; i++) rc = kiln_atomic_write(&a, w->e[i].data, w->e[i].nbytes);
    if (rc) kiln_atomic_abort(&a);
    else rc = kiln_atomic_commit(&a);
out:
    free(text);
    json_decref(h);
    return rc;
}

kiln_err kiln_st_out_ok(const char *path, const char *const *tensors, const char *what) {
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT) return KILN_OK;
        return kiln_fail_errno(KILN_ERR_IO, "cannot look at '%s'", path);
    }
    KILN_FAIL_IF(!S_ISREG(sb.st_mode), KILN_ERR_CONFLICT,
                 "'%s' exists and is not a file; %s is written to a new file or over one", path,
                 what);
    kiln_st *st = NULL;
    kiln_err rc = kiln_st_open(path, &st);
    bool kind = !rc;
    for (size_t i = 0; kind && tensors[i]; i++)
        kind = kiln_st_find(st, tensors[i]) != NULL;
    kiln_st_close(st);
    if (rc == KILN_ERR_NOMEM) return rc;
    kiln_errclear();
    KILN_FAIL_IF(!kind, KILN_ERR_CONFLICT,
                 "'%s' exists and is not %s; it is written to a new file or over one, never over "
                 "another file: give another output",
                 path, what);
    return KILN_OK;
}

kiln_err kiln_st_open_fd(int fd, const char *label, kiln_st **out) {
    *out = NULL;
    kiln_st *st = kiln_calloc(1, sizeof *st);
    if (!st) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    st->path = kiln_strdup(label);
    KILN_CHECK_IF(rc, fail, !st->path, KILN_ERR_NOMEM, "out of memory");
    struct stat sb;
    KILN_CHECK_IF(rc, fail, fstat(fd, &sb) != 0, KILN_ERR_IO, "cannot stat '%s': %s", label,
                  strerror(errno));
    KILN_CHECK_IF(rc, fail, !S_ISREG(sb.st_mode), KILN_ERR_IO, "'%s' is not a regular file",
                  label);
    st->len = (size_t)sb.st_size;
    if (st->len > 0) {
        void *m = mmap(NULL, st->len, PROT_READ, MAP_PRIVATE, fd, 0);
        KILN_CHECK_IF(rc, fail, m == MAP_FAILED, KILN_ERR_IO, "cannot map '%s': %s", label,
                      strerror(errno));
        st->base = m;
        st->mapped = true;
    }
    KILN_CHECK(rc, fail, parse(st));
    *out = st;
    return KILN_OK;
fail:
    kiln_st_close(st);
    return rc;
}

void kiln_st_sha256(const kiln_st *st, uint8_t out[KILN_SHA256_BYTES]) {
    kiln_sha256(st->base, st->len, out);
}
