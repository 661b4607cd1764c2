/* spec.c - a sweep's spec: read, checked key by key as kiln train checks its config,
 * expanded into named points. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "data.h"
#include "sweep_int.h"
#include "train.h"

/* Hex digits of the whole name's digest that end a cut point name. */
#define SWEEP_NAME_DIGEST 16

void kiln_sweep_spec_release(kiln_sweep_spec *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n_points; i++) {
        free(s->points[i].name);
        json_decref(s->points[i].overrides);
    }
    free(s->points);
    json_decref(s->spec);
    free(s->data);
    free(s->slurm.partition);
    free(s->slurm.time);
    memset(s, 0, sizeof *s);
}

int sweep_digits(double x, int at_least) {
    char buf[40];
    int lo = at_least < 1 ? 1 : at_least, hi = 17;
    snprintf(buf, sizeof buf, "%.*g", lo, x);
    if (lo >= 17 || strtod(buf, NULL) == x) return lo;
    /* A binary search over the rest (whatever it returns reads back: hi always does). */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        snprintf(buf, sizeof buf, "%.*g", mid, x);
        if (strtod(buf, NULL) == x)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* A value as it appears in a point's name: numbers as short as read back the same, strings
 * with anything but [A-Za-z0-9._-] as '_'. */
static void value_text(const json_t *v, char *out, size_t n) {
    if (json_is_integer(v)) {
        snprintf(out, n, "%lld", (long long)json_integer_value(v));
    } else if (json_is_real(v)) {
        double x = json_real_value(v);
        /* The fewest digits found by counting up (names must not change from release to
         * release: a root's point is found by its name). */
        for (int p = 1; p <= 17; p++) {
            snprintf(out, n, "%.*g", p, x);
            if (strtod(out, NULL) == x) break;
        }
    } else if (json_is_string(v)) {
        snprintf(out, n, "%s", json_string_value(v));
        for (char *c = out; *c; c++)
            if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                  (*c >= '0' && *c <= '9') || *c == '.' || *c == '-'))
                *c = '_';
    } else if (json_is_boolean(v)) {
        snprintf(out, n, "%s", json_is_true(v) ? "true" : "false");
    } else {
        snprintf(out, n, "null");
    }
}

/* "d_model-16,lr-0.001,seed-2": the overrides in key order; "base" when there are none. A
 * name longer than KILN_SWEEP_NAME_MAX keeps the whole pairs that fit and ends in '~' and a
 * digest of the whole name ("adam_eps-1e-08,...,grad_clip-1.5~3f2a09c1d4b7e5a6": stable, and
 * '~' is in no whole name). Caller frees. */
static char *point_name(const json_t *over) {
    size_t n;
    const char **keys = kiln_json_sorted_keys(over, &n);
    if (!keys) return NULL;
    size_t cap = 16;
    for (size_t i = 0; i < n; i++)
        cap += strlen(keys[i]) + 80;
    char *s = kiln_malloc(cap);
    if (s) {
        size_t len = 0;
        s[0] = 0;
        for (size_t i = 0; i < n; i++) {
            char v[72];
            value_text(json_object_get(over, keys[i]), v, sizeof v);
            len += (size_t)snprintf(s + len, cap - len, "%s%s-%s", i ? "," : "", keys[i], v);
        }
        if (!n) snprintf(s, cap, "base");
        if (strlen(s) > KILN_SWEEP_NAME_MAX) {
            uint8_t h[KILN_SHA256_BYTES];
            char hex[KILN_SHA256_HEX];
            kiln_sha256(s, strlen(s), h);
            kiln_hex(h, sizeof h, hex);
            /* The whole KEY-VALUE pairs that fit (a value cut short would read as another
             * value), then the digest. */
            size_t keep = KILN_SWEEP_NAME_MAX - 1 - SWEEP_NAME_DIGEST;
            while (keep > 0 && s[keep] != ',')
                keep--;
            snprintf(s + keep, cap - keep, "~%.*s", SWEEP_NAME_DIGEST, hex);
        }
    }
    free(keys);
    return s;
}

/* "ranks" is the sweep's own key: taken out of o (a copy) into *ranks. */
static kiln_err take_ranks(json_t *o, const char *label, int *ranks) {
    json_t *r = json_object_get(o, "ranks");
    if (!r) return KILN_OK;
    KILN_FAIL_IF(!json_is_integer(r) || json_integer_value(r) < 1 || json_integer_value(r) > 1024,
                 KILN_ERR_CONFIG, "%s: 'ranks' must be an integer between 1 and 1024", label);
    *ranks = (int)json_integer_value(r);
    json_object_del(o, "ranks");
    return KILN_OK;
}

/* What expansion carries from point to point. */
typedef struct expand {
    const char *path;
    kiln_train_config base; /* the defaults with the spec's config applied */
    int base_ranks;
    size_t cap;        /* of s->points */
    sweep_index names; /* name -> its point's index */
} expand;

/* A point from the spec's config and the overrides: checked, its whole config, its name. */
static kiln_err add_point(kiln_sweep_spec *s, expand *x, json_t *over) {
    kiln_err rc = KILN_OK;
    char *name = point_name(over);
    json_t *keys = json_deep_copy(over);
    if (!name || !keys) {
        free(name);
        json_decref(keys);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    char label[1024];
    snprintf(label, sizeof label, "'%s' point '%s'", x->path, name);
    int ranks = x->base_ranks;
    kiln_train_config cfg = x->base;
    KILN_CHECK(rc, fail, take_ranks(keys, label, &ranks));
    KILN_CHECK(rc, fail, kiln_train_config_apply(&cfg, keys, label));
    KILN_CHECK(rc, fail, kiln_train_config_check(&cfg, label));
    KILN_CHECK_IF(rc, fail, cfg.accum_steps % ranks, KILN_ERR_CONFIG,
                  "%s: config key 'accum_steps' (%d) is not a multiple of the %d ranks", label,
                  cfg.accum_steps, ranks);
    size_t dup = sweep_index_get(&x->names, name);
    KILN_CHECK_IF(rc, fail, dup != SIZE_MAX, KILN_ERR_CONFIG,
                  "'%s': points %zu and %zu would both be named '%s' (each point is a run "
                  "directory named after what it sets)",
                  x->path, dup + 1, s->n_points + 1, name);
    if (s->n_points == x->cap) {
        size_t nc = x->cap ? x->cap * 2 : 8;
        kiln_sweep_point *p = realloc(s->points, nc * sizeof *p);
        KILN_CHECK_IF(rc, fail, !p, KILN_ERR_NOMEM, "out of memory");
        s->points = p;
        x->cap = nc;
    }
    KILN_CHECK(rc, fail, sweep_index_put(&x->names, name, s->n_points));
    json_decref(keys);
    s->points[s->n_points++] = (kiln_sweep_point){
        .name = name, .overrides = json_incref(over), .config = cfg, .ranks = ranks};
    return KILN_OK;
fail:
    free(name);
    json_decref(keys);
    return rc;
}

/* Each point of the list times each seed. */
static kiln_err add_seeded(kiln_sweep_spec *s, expand *x, const json_t *seeds, json_t *over) {
    if (!seeds) return add_point(s, x, over);
    size_t i;
    json_t *seed;
    json_array_foreach(seeds, i, seed) {
        json_t *o = json_deep_copy(over);
        if (!o || json_object_set(o, "seed", seed)) {
            json_decref(o);
            return kiln_fail(KILN_ERR_NOMEM, "out of memory");
        }
        kiln_err rc = add_point(s, x, o);
        json_decref(o);
        KILN_TRY(rc);
    }
    return KILN_OK;
}

/* The grid's product (its size checked by points_total), the last key (in sorted order)
 * varying fastest. */
static kiln_err add_grid(kiln_sweep_spec *s, expand *x, const json_t *grid, const json_t *seeds) {
    size_t n;
    const char **keys = kiln_json_sorted_keys(grid, &n);
    if (!keys) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_err rc = KILN_OK;
    size_t total = 1;
    for (size_t k = 0; k < n; k++)
        total *= json_array_size(json_object_get(grid, keys[k]));
    for (size_t idx = 0; idx < total && !rc; idx++) {
        json_t *over = json_object();
        if (!over) {
            rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
            break;
        }
        /* idx in mixed radix, the last key the lowest digit. */
        size_t r = idx;
        for (size_t k = n; k-- > 0 && !rc;) {
            const json_t *vals = json_object_get(grid, keys[k]);
            size_t m = json_array_size(vals);
            if (json_object_set(over, keys[k], json_array_get(vals, r % m)))
                rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
            r /= m;
        }
        if (!rc) rc = add_seeded(s, x, seeds, over);
        json_decref(over);
    }
    free(keys);
    return rc;
}

/* How many points the spec makes, (grid product + explicit points, or 1) x seeds, refused
 * above KILN_SWEEP_MAX_POINTS before any is made: the grid's product alone is no bound when
 * seeds and points multiply it. */
static kiln_err points_total(const char *path, const json_t *grid, const json_t *points,
                             const json_t *seeds, size_t *total) {
    size_t g = 0;
    bool over = false; /* past SIZE_MAX */
    if (grid) {
        g = 1;
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)grid, k, v) {
            KILN_FAIL_IF(!json_is_array(v) || !json_array_size(v), KILN_ERR_CONFIG,
                         "'%s': grid key '%s' must be a non-empty array of values", path, k);
            over |= !kiln_mul_ok(g, json_array_size(v), &g);
        }
    }
    size_t p = points ? json_array_size(points) : 0, k = seeds ? json_array_size(seeds) : 1;
    size_t base = grid || points ? g + p : 1, n = 0;
    over |= base < g || !kiln_mul_ok(base, k, &n);
    if (over || n > KILN_SWEEP_MAX_POINTS) {
        char gs[32] = "2^64 or more", ns[32] = "2^64 or more";
        if (!over) {
            snprintf(gs, sizeof gs, "%zu", g);
            snprintf(ns, sizeof ns, "%zu", n);
        }
        return kiln_fail(KILN_ERR_LIMIT,
                         "'%s': the sweep would have %s points ((grid %s + %zu points) x %zu "
                         "seeds), more than %d",
                         path, ns, over ? "?" : gs, p, k, KILN_SWEEP_MAX_POINTS);
    }
    *total = n;
    return KILN_OK;
}

static kiln_err load_slurm(kiln_sweep_slurm *sl, const json_t *j, const char *path) {
    sl->cpus = 1;
    sl->signal_seconds = 60;
    if (!j) return KILN_OK;
    KILN_FAIL_IF(!json_is_object(j), KILN_ERR_CONFIG, "'%s': 'slurm' must be an object", path);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)j, k, v) {
        if (!strcmp(k, "partition") || !strcmp(k, "time")) {
            const char *t = json_string_value(v);
            /* Into the batch script's #SBATCH lines: no white space or quotes. */
            KILN_FAIL_IF(!t || !*t || strlen(t) > 64 || strpbrk(t, " \t\r\n'\"\\$`"),
                         KILN_ERR_CONFIG,
                         "'%s': slurm key '%s' must be a word (as sbatch takes it)", path, k);
            char *c = kiln_strdup(t);
            if (!c) return KILN_ERR_NOMEM;
            char **dst = !strcmp(k, "partition") ? &sl->partition : &sl->time;
            free(*dst);
            *dst = c;
        } else if (!strcmp(k, "cpus") || !strcmp(k, "gpus") || !strcmp(k, "signal_seconds")) {
            long lo = !strcmp(k, "gpus") ? 0 : 1;
            KILN_FAIL_IF(!json_is_integer(v) || json_integer_value(v) < lo ||
                             json_integer_value(v) > 100000,
                         KILN_ERR_CONFIG, "'%s': slurm key '%s' must be an integer of at least %ld",
                         path, k, lo);
            int x = (int)json_integer_value(v);
            if (!strcmp(k, "cpus"))
                sl->cpus = x;
            else if (!strcmp(k, "gpus"))
                sl->gpus = x;
            else
                sl->signal_seconds = x;
        } else {
            return kiln_fail(KILN_ERR_CONFIG,
                             "'%s': unknown slurm key '%s' (partition, time, cpus, gpus, "
                             "signal_seconds)",
                             path, k);
        }
    }
    return KILN_OK;
}

kiln_err kiln_sweep_spec_load(const char *path, kiln_sweep_spec *out) {
    memset(out, 0, sizeof *out);
    kiln_err rc = KILN_OK;
    json_t *j = NULL, *base = NULL;
    char *dir = NULL, *data = NULL;
    expand x = {0};
    KILN_CHECK(rc, fail, kiln_json_load_file(path, &j));
    KILN_CHECK_IF(rc, fail, !json_is_object(j), KILN_ERR_CONFIG,
                  "'%s': a sweep spec is a JSON object", path);
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v) {
        static const char *const known[] = {"data", "config", "grid", "points", "seeds", "slurm"};
        bool ok = false;
        for (size_t i = 0; i < KILN_ARRAY_LEN(known); i++)
            ok |= !strcmp(k, known[i]);
        KILN_CHECK_IF(rc, fail, !ok, KILN_ERR_CONFIG,
                      "'%s': unknown key '%s' (data, config, grid, points, seeds, slurm)", path, k);
    }
    const char *d = json_string_value(json_object_get(j, "data"));
    KILN_CHECK_IF(rc, fail, !d || !*d, KILN_ERR_CONFIG,
                  "'%s': 'data' (the dataset's path) must be a non-empty string", path);
    const json_t *cfg = json_object_get(j, "config"), *grid = json_object_get(j, "grid"),
                 *points = json_object_get(j, "points"), *seeds = json_object_get(j, "seeds");
    KILN_CHECK_IF(rc, fail, cfg && !json_is_object(cfg), KILN_ERR_CONFIG,
                  "'%s': 'config' must be an object of config keys", path);
    KILN_CHECK_IF(rc, fail, grid && !json_is_object(grid), KILN_ERR_CONFIG,
                  "'%s': 'grid' must be an object of config keys and arrays of values", path);
    KILN_CHECK_IF(rc, fail, points && !json_is_array(points), KILN_ERR_CONFIG,
                  "'%s': 'points' must be an array of objects", path);
    if (seeds) {
        KILN_CHECK_IF(rc, fail, !json_is_array(seeds) || !json_array_size(seeds), KILN_ERR_CONFIG,
                      "'%s': 'seeds' must be a non-empty array of integers", path);
        size_t i;
        json_array_foreach(seeds, i, v) KILN_CHECK_IF(
            rc, fail, !json_is_integer(v) || json_integer_value(v) < 0, KILN_ERR_CONFIG,
            "'%s': seed %zu is not a non-negative integer", path, i + 1);
        KILN_CHECK_IF(
            rc, fail,
            (cfg && json_object_get(cfg, "seed")) || (grid && json_object_get(grid, "seed")),
            KILN_ERR_CONFIG, "'%s': 'seeds' and a 'seed' key in config or grid: give one", path);
    }
    KILN_CHECK(rc, fail, load_slurm(&out->slurm, json_object_get(j, "slurm"), path));

    /* The base config: checked on its own, so that its errors name it. */
    size_t total = 0;
    KILN_CHECK(rc, fail, points_total(path, grid, points, seeds, &total));
    char label[1024];
    snprintf(label, sizeof label, "'%s' config", path);
    base = cfg ? json_deep_copy(cfg) : json_object();
    KILN_CHECK_IF(rc, fail, !base, KILN_ERR_NOMEM, "out of memory");
    x.path = path;
    x.base_ranks = 1;
    KILN_CHECK(rc, fail, take_ranks(base, label, &x.base_ranks));
    kiln_train_config_default(&x.base);
    KILN_CHECK(rc, fail, kiln_train_config_apply(&x.base, base, label));
    KILN_CHECK(rc, fail, sweep_index_init(&x.names, total));
    out->points = kiln_calloc(total, sizeof *out->points);
    KILN_CHECK_IF(rc, fail, !out->points, KILN_ERR_NOMEM, "out of memory");
    x.cap = total;
    if (grid) KILN_CHECK(rc, fail, add_grid(out, &x, grid, seeds));
    if (points) {
        size_t i;
        json_array_foreach(points, i, v) {
            KILN_CHECK_IF(rc, fail, !json_is_object(v) || !json_object_size(v), KILN_ERR_CONFIG,
                          "'%s': point %zu must be a non-empty object of config keys", path, i + 1);
            KILN_CHECK(rc, fail, add_seeded(out, &x, seeds, v));
        }
    }
    if (!grid && !points) {
        json_t *none = json_object();
        KILN_CHECK_IF(rc, fail, !none, KILN_ERR_NOMEM, "out of memory");
        rc = add_seeded(out, &x, seeds, none);
        json_decref(none);
        if (rc) goto fail;
    }
    KILN_CHECK_IF(rc, fail, !out->n_points, KILN_ERR_CONFIG, "'%s': the sweep has no points", path);

    /* The dataset: a relative path is the spec's directory's. It must open. */
    dir = kiln_dirname(path);
    KILN_CHECK_IF(rc, fail, !dir, KILN_ERR_NOMEM, "out of memory");
    data = d[0] == '/' ? kiln_strdup(d) : kiln_path_join(dir, d);
    KILN_CHECK_IF(rc, fail, !data, KILN_ERR_NOMEM, "out of memory");
    char abs[PATH_MAX];
    KILN_CHECK_IF(rc, fail, !realpath(data, abs), KILN_ERR_IO, "'%s': dataset '%s': %s", path, d,
                  strerror(errno));
    kiln_dataset *ds = NULL;
    rc = kiln_dataset_open(abs, &ds);
    if (rc) {
        kiln_errprefix(rc, "'%s': ", path);
        goto fail;
    }
    /* Its content's digest (kiln data inspect's sha256): a root records it, so that a sweep
     * whose dataset was replaced under the same path is not extended on other bytes. */
    memcpy(out->data_sha256, ds->sha256, sizeof out->data_sha256);
    kiln_dataset_free(ds);
    out->data = kiln_strdup(abs);
    KILN_CHECK_IF(rc, fail, !out->data, KILN_ERR_NOMEM, "out of memory");

    char *canon = kiln_json_canonical(j);
    KILN_CHECK_IF(rc, fail, !canon, KILN_ERR_NOMEM, "out of memory");
    uint8_t h[KILN_SHA256_BYTES];
    kiln_sha256(canon, strlen(canon), h);
    free(canon);
    kiln_hex(h, sizeof h, out->digest);
    out->spec = j;
    j = NULL;
fail:
    json_decref(j);
    json_decref(base);
    sweep_index_release(&x.names);
    free(dir);
    free(data);
    if (rc) kiln_sweep_spec_release(out);
    return rc;
}
