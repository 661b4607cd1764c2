/* model_format.c - the kiln-tsmoe/1 config and parameter table: one definition that
 * the trainer, the runtime, export and validation all read. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

#define CFG_INTS(X)                                                                                \
    X(n_features) X(n_outputs) X(d_model) X(n_layers) X(n_heads) X(d_ff) X(n_experts) X(top_k)     \
        X(seq_len) X(attn_window)

kiln_err kiln_model_config_parse(const json_t *j, const char *label, kiln_model_config *cfg) {
    KILN_FAIL_IF(!json_is_object(j), KILN_ERR_FORMAT, "'%s': model config is not a JSON object", label);
    memset(cfg, 0, sizeof *cfg);
    cfg->norm_eps = 1e-5f;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)j, key, v) {
        if (!strcmp(key, "format")) {
            KILN_FAIL_IF(!json_is_string(v) || strcmp(json_string_value(v), KILN_MODEL_FORMAT), KILN_ERR_FORMAT,
                         "'%s': model format must be \"%s\"", label, KILN_MODEL_FORMAT);
            continue;
        }
        if (!strcmp(key, "norm_eps")) {
            KILN_FAIL_IF(!json_is_number(v) || !(json_number_value(v) > 0), KILN_ERR_CONFIG,
                         "'%s': norm_eps must be a positive number", label);
            cfg->norm_eps = (float)json_number_value(v);
            continue;
        }
#define PARSE_INT(k)                                                                               \
    if (!strcmp(key, #k)) {                                                                        \
        KILN_FAIL_IF(!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (1 << 30), \
                     KILN_ERR_CONFIG, "'%s': " #k " must be a non-negative integer", label);       \
        cfg->k = (int)json_integer_value(v);                                                       \
        continue;                                                                                  \
    }
        CFG_INTS(PARSE_INT)
#undef PARSE_INT
        return kiln_fail(KILN_ERR_CONFIG, "'%s': unknown model config key '%s'", label, key);
    }
    KILN_FAIL_IF(!json_object_get(j, "format"), KILN_ERR_FORMAT, "'%s': model config has no \"format\"", label);
#define REQUIRE(k) KILN_FAIL_IF(!json_object_get(j, #k), KILN_ERR_CONFIG, "'%s': model config lacks '" #k "'", label);
    CFG_INTS(REQUIRE)
#undef REQUIRE
    return kiln_model_config_check(cfg, label);
}

kiln_err kiln_model_config_check(const kiln_model_config *c, const char *label) {
#define POS(k) KILN_FAIL_IF(c->k < 1, KILN_ERR_CONFIG, "'%s': " #k " must be at least 1 (is %d)", label, c->k);
    POS(n_features) POS(n_outputs) POS(d_model) POS(n_layers) POS(n_heads) POS(d_ff) POS(seq_len) POS(attn_window)
#undef POS
    KILN_FAIL_IF(c->d_model % c->n_heads, KILN_ERR_CONFIG,
                 "'%s': d_model %d is not a multiple of n_heads %d", label, c->d_model, c->n_heads);
    KILN_FAIL_IF(c->n_experts < 0, KILN_ERR_CONFIG, "'%s': n_experts must not be negative", label);
    if (c->n_experts == 0)
        KILN_FAIL_IF(c->top_k != 0, KILN_ERR_CONFIG, "'%s': top_k must be 0 when n_experts is 0 (is %d)", label, c->top_k);
    else
        KILN_FAIL_IF(c->top_k < 1 || c->top_k > c->n_experts, KILN_ERR_CONFIG,
                     "'%s': top_k must be between 1 and n_experts %d (is %d)", label, c->n_experts, c->top_k);
    KILN_FAIL_IF(c->attn_window > c->seq_len, KILN_ERR_CONFIG,
                 "'%s': attn_window %d is larger than seq_len %d", label, c->attn_window, c->seq_len);
    KILN_FAIL_IF(!(c->norm_eps > 0) || !isfinite(c->norm_eps), KILN_ERR_CONFIG, "'%s': norm_eps must be positive", label);
    /* Every tensor and count must stay well inside 32 bits of elements. */
    double biggest = (double)(c->n_experts ? c->n_experts : 1) * c->d_ff * c->d_model;
    KILN_FAIL_IF(biggest > 1e9 || (double)c->d_model * 3 * c->d_model > 1e9 || c->n_layers > 4096 ||
                     c->n_experts > 4096 || c->seq_len > (1 << 20),
                 KILN_ERR_CONFIG, "'%s': model sizes are too large", label);
    return KILN_OK;
}

json_t *kiln_model_config_json(const kiln_model_config *c) {
    json_t *j = json_object();
    if (!j) return NULL;
    json_object_set_new(j, "format", json_string(KILN_MODEL_FORMAT));
#define EMIT(k) json_object_set_new(j, #k, json_integer(c->k));
    CFG_INTS(EMIT)
#undef EMIT
    /* The shortest decimal that reads back as the same float (1e-05, not 9.99999975e-06). */
    char buf[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)c->norm_eps);
        if ((float)strtod(buf, NULL) == c->norm_eps) break;
    }
    json_object_set_new(j, "norm_eps", json_real(strtod(buf, NULL)));
    return j;
}

char *kiln_model_config_text(const kiln_model_config *c) {
    json_t *j = kiln_model_config_json(c);
    if (!j) {
        kiln_fail(KILN_ERR_NOMEM, "out of memory");
        return NULL;
    }
    char *s = kiln_json_canonical(j);
    json_decref(j);
    return s;
}

kiln_err kiln_model_config_from_st(const kiln_st *st, kiln_model_config *cfg) {
    const char *text = kiln_st_meta(st, "kiln.config");
    KILN_FAIL_IF(!text, KILN_ERR_FORMAT, "'%s': no kiln.config in __metadata__", kiln_st_path(st));
    json_t *j;
    KILN_TRY(kiln_json_parse(text, strlen(text), kiln_st_path(st), &j));
    kiln_err rc = kiln_model_config_parse(j, kiln_st_path(st), cfg);
    json_decref(j);
    return rc;
}

static void add(kiln_param *p, size_t *n, size_t *off, int flags, int ndim, int64_t a, int64_t b, int64_t c,
                const char *fmt, int layer) {
    kiln_param *q = &p[(*n)++];
    snprintf(q->name, sizeof q->name, fmt, layer);
    q->ndim = ndim;
    q->shape[0] = a;
    q->shape[1] = b;
    q->shape[2] = c;
    q->numel = (size_t)a * (size_t)(ndim > 1 ? b : 1) * (size_t)(ndim > 2 ? c : 1);
    q->offset = *off;
    q->flags = flags;
    *off += q->numel;
}

kiln_err kiln_param_table(const kiln_model_config *c, kiln_param **params, size_t *count, size_t *total) {
    KILN_TRY(kiln_model_config_check(c, "model config"));
    size_t cap = 4 + 11 * (size_t)c->n_layers + 3; /* top, per block at most 6 + 5, tail */
    kiln_param *p = kiln_calloc(cap, sizeof *p);
    if (!p) return KILN_ERR_NOMEM;
    size_t n = 0, off = 0;
    const int T = KILN_PARAM_TRAINED, TD = KILN_PARAM_TRAINED | KILN_PARAM_DECAY;
    const int64_t F = c->n_features, O = c->n_outputs, D = c->d_model, Fh = c->d_ff, E = c->n_experts;
    add(p, &n, &off, 0, 1, F, 0, 0, "norm.in_mean", 0);
    add(p, &n, &off, 0, 1, F, 0, 0, "norm.in_std", 0);
    add(p, &n, &off, TD, 2, D, F, 0, "embed.weight", 0);
    add(p, &n, &off, T, 1, D, 0, 0, "embed.bias", 0);
    for (int l = 0; l < c->n_layers; l++) {
        add(p, &n, &off, T, 1, D, 0, 0, "blocks.%d.attn_norm.weight", l);
        add(p, &n, &off, TD, 2, 3 * D, D, 0, "blocks.%d.attn.qkv.weight", l);
        add(p, &n, &off, T, 1, 3 * D, 0, 0, "blocks.%d.attn.qkv.bias", l);
        add(p, &n, &off, TD, 2, D, D, 0, "blocks.%d.attn.out.weight", l);
        add(p, &n, &off, T, 1, D, 0, 0, "blocks.%d.attn.out.bias", l);
        add(p, &n, &off, T, 1, D, 0, 0, "blocks.%d.ffn_norm.weight", l);
        if (E == 0) {
            add(p, &n, &off, TD, 2, Fh, D, 0, "blocks.%d.ffn.fc.weight", l);
            add(p, &n, &off, T, 1, Fh, 0, 0, "blocks.%d.ffn.fc.bias", l);
            add(p, &n, &off, TD, 2, D, Fh, 0, "blocks.%d.ffn.proj.weight", l);
            add(p, &n, &off, T, 1, D, 0, 0, "blocks.%d.ffn.proj.bias", l);
        } else {
            add(p, &n, &off, TD, 2, E, D, 0, "blocks.%d.moe.router.weight", l);
            add(p, &n, &off, TD, 3, E, Fh, D, "blocks.%d.moe.fc.weight", l);
            add(p, &n, &off, T, 2, E, Fh, 0, "blocks.%d.moe.fc.bias", l);
            add(p, &n, &off, TD, 3, E, D, Fh, "blocks.%d.moe.proj.weight", l);
            add(p, &n, &off, T, 2, E, D, 0, "blocks.%d.moe.proj.bias", l);
        }
    }
    add(p, &n, &off, T, 1, D, 0, 0, "final_norm.weight", 0);
    add(p, &n, &off, TD, 2, O, D, 0, "head.weight", 0);
    add(p, &n, &off, T, 1, O, 0, 0, "head.bias", 0);
    *params = p;
    *count = n;
    *total = off;
    return KILN_OK;
}

long kiln_param_find(const kiln_param *params, size_t count, const char *name) {
    for (size_t i = 0; i < count; i++)
        if (!strcmp(params[i].name, name)) return (long)i;
    return -1;
}

kiln_err kiln_target_norm_read(const kiln_st *st, int O, float *mean, float *std, bool *present) {
    for (int o = 0; o < O; o++)
        mean[o] = 0, std[o] = 1;
    *present = false;
    const char *text = kiln_st_meta(st, "kiln.target_norm");
    if (!text) return KILN_OK;
    const char *path = kiln_st_path(st);
    json_t *j;
    KILN_TRY(kiln_json_parse(text, strlen(text), "kiln.target_norm", &j));
    kiln_err rc = KILN_OK;
    const json_t *m = json_object_get(j, "mean"), *s = json_object_get(j, "std");
    if (!json_is_object(j) || json_object_size(j) != 2 || !json_is_array(m) || !json_is_array(s) ||
        json_array_size(m) != (size_t)O || json_array_size(s) != (size_t)O)
        rc = kiln_fail(KILN_ERR_FORMAT,
                       "'%s': kiln.target_norm is not {\"mean\": [%d numbers], \"std\": [%d "
                       "numbers]}",
                       path, O, O);
    for (int o = 0; !rc && o < O; o++) {
        const json_t *a = json_array_get(m, (size_t)o), *b = json_array_get(s, (size_t)o);
        double mv = json_number_value(a), sv = json_number_value(b);
        if (!json_is_number(a) || !json_is_number(b) || !isfinite(mv) || !(sv > 0) ||
            !isfinite(sv) || fabs(mv) > 3.4e38 || sv > 3.4e38)
            rc = kiln_fail(KILN_ERR_FORMAT,
                           "'%s': kiln.target_norm: target %d needs a finite mean and a positive "
                           "std",
                           path, o);
        mean[o] = (float)mv;
        std[o] = (float)sv;
    }
    json_decref(j);
    if (rc) {
        for (int o = 0; o < O; o++)
            mean[o] = 0, std[o] = 1;
        return rc;
    }
    *present = true;
    return KILN_OK;
}

char *kiln_target_norm_text(int O, const float *mean, const float *std) {
    size_t cap = 32 + (size_t)O * 2 * 20, n = 0;
    char *s = kiln_malloc(cap);
    if (!s) return NULL;
    n += (size_t)snprintf(s + n, cap - n, "{\"mean\":[");
    for (int o = 0; o < O; o++)
        n += (size_t)snprintf(s + n, cap - n, "%s%.9g", o ? "," : "", (double)mean[o]);
    n += (size_t)snprintf(s + n, cap - n, "],\"std\":[");
    for (int o = 0; o < O; o++)
        n += (size_t)snprintf(s + n, cap - n, "%s%.9g", o ? "," : "", (double)std[o]);
    snprintf(s + n, cap - n, "]}");
    return s;
}
