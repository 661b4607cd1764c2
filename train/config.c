/* config.c - the run config: one table of keys drives defaults, parsing, --set, output
 * and the resume rules, so a key cannot be known to one and missing from another. */
#include <math.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

typedef enum {
    K_INT,
    K_LONG,
    K_U64,
    K_DBL,
    K_FLT,
    K_BOOL,
    K_OPTIM,
    K_FORMAT,
    K_DEVICE,
    K_PREC,
    K_TIME, /* char[hi]: "" or a time (kiln_time_parse); JSON: a string, left out when "" */
    K_DUR   /* char[hi]: "" or a duration (kiln_duration_parse) */
} ktype;

typedef struct key {
    const char *name;
    ktype type;
    size_t off;
    double lo, hi;  /* inclusive range for numbers */
    bool lo_open;   /* lo itself not allowed (lr > 0) */
    bool hi_open;   /* hi itself not allowed (beta < 1) */
    bool resumable; /* may change on --resume */
} key;

#define OFF(f) offsetof(kiln_train_config, f)
#define BIG 1e15
static const key keys[] = {
    {"accum_steps", K_INT, OFF(accum_steps), 1, 1 << 16, false, false, false},
    {"adam_eps", K_DBL, OFF(adam_eps), 0, 1, true, false, false},
    {"attn_window", K_INT, OFF(model.attn_window), 1, 1 << 20, false, false, false},
    {"aux_loss_coef", K_DBL, OFF(aux_loss_coef), 0, 1e6, false, false, false},
    {"batch_size", K_INT, OFF(batch_size), 1, 1 << 20, false, false, false},
    {"beta1", K_DBL, OFF(beta1), 0, 1, false, true, false},
    {"beta2", K_DBL, OFF(beta2), 0, 1, false, true, false},
    {"capacity_factor", K_DBL, OFF(capacity_factor), 0, 1e6, false, false, false},
    {"ckpt_every", K_LONG, OFF(ckpt_every), 0, BIG, false, false, true},
    {"d_ff", K_INT, OFF(model.d_ff), 1, 1 << 30, false, false, false},
    {"d_model", K_INT, OFF(model.d_model), 1, 1 << 30, false, false, false},
    {"device", K_DEVICE, OFF(device), 0, 0, false, false, true},
    {"eval_every", K_LONG, OFF(eval_every), 0, BIG, false, false, true},
    {"format", K_FORMAT, 0, 0, 0, false, false, false},
    {"grad_clip", K_DBL, OFF(grad_clip), 0, 1e30, false, false, false},
    {"keep", K_INT, OFF(keep), 0, 1 << 30, false, false, true},
    {"lr", K_DBL, OFF(lr), 0, 1e6, true, false, false},
    {"max_bad_steps", K_INT, OFF(max_bad_steps), 1, 1 << 30, false, false, true},
    {"min_lr", K_DBL, OFF(min_lr), 0, 1e6, false, false, false},
    {"n_experts", K_INT, OFF(model.n_experts), 0, 4096, false, false, false},
    {"n_features", K_INT, OFF(model.n_features), 1, 1 << 30, false, false, false},
    {"n_heads", K_INT, OFF(model.n_heads), 1, 1 << 30, false, false, false},
    {"n_layers", K_INT, OFF(model.n_layers), 1, 4096, false, false, false},
    {"n_outputs", K_INT, OFF(model.n_outputs), 1, 1 << 30, false, false, false},
    {"norm_eps", K_FLT, OFF(model.norm_eps), 0, 1, true, false, false},
    {"optimizer", K_OPTIM, OFF(optimizer), 0, 0, false, false, false},
    {"precision", K_PREC, OFF(precision), 0, 0, false, false, true},
    {"purge_rows", K_LONG, OFF(purge_rows), 0, BIG, false, false, false},
    {"purge_time", K_DUR, OFF(purge_time), 0, 24, false, false, false},
    {"seed", K_U64, OFF(seed), 0, 0, false, false, false},
    {"seq_len", K_INT, OFF(model.seq_len), 1, 1 << 20, false, false, false},
    {"skip_spikes", K_BOOL, OFF(skip_spikes), 0, 0, false, false, true},
    {"steps", K_LONG, OFF(steps), 1, BIG, false, false, true},
    {"threads", K_INT, OFF(threads), 0, 1024, false, false, true},
    {"top_k", K_INT, OFF(model.top_k), 0, 4096, false, false, false},
    {"val_fraction", K_DBL, OFF(val_fraction), 0, 1, false, true, false},
    {"val_from", K_TIME, OFF(val_from), 0, 40, false, false, false},
    {"warmup_steps", K_LONG, OFF(warmup_steps), 0, BIG, false, false, false},
    {"weight_decay", K_DBL, OFF(weight_decay), 0, 1e6, false, false, false},
    {"z_loss_coef", K_DBL, OFF(z_loss_coef), 0, 1e6, false, false, false},
};

static const key *find_key(const char *name) {
    for (size_t i = 0; i < KILN_ARRAY_LEN(keys); i++)
        if (!strcmp(keys[i].name, name)) return &keys[i];
    return NULL;
}

void kiln_train_config_default(kiln_train_config *c) {
    memset(c, 0, sizeof *c);
    c->model = (kiln_model_config){.n_features = 0,
                                   .n_outputs = 0,
                                   .d_model = 32,
                                   .n_layers = 2,
                                   .n_heads = 4,
                                   .d_ff = 64,
                                   .n_experts = 4,
                                   .top_k = 2,
                                   .seq_len = 32,
                                   .attn_window = 32,
                                   .norm_eps = 1e-5f};
    c->steps = 600;
    c->batch_size = 16;
    c->accum_steps = 1;
    c->optimizer = KILN_OPTIM_ADAMW;
    c->lr = 3e-3;
    c->min_lr = 3e-4;
    c->warmup_steps = 30;
    c->weight_decay = 0.01;
    c->beta1 = 0.9;
    c->beta2 = 0.99;
    c->adam_eps = 1e-8;
    c->grad_clip = 1.0;
    c->seed = 1;
    c->val_fraction = 0.2;
    c->eval_every = 100;
    c->ckpt_every = 200;
    c->keep = 3;
    c->aux_loss_coef = 0.01;
    c->z_loss_coef = 0.001;
    c->capacity_factor = 0;
    c->max_bad_steps = 5;
    c->skip_spikes = false;
    c->threads = 0;
    c->device = KILN_TRAIN_CPU;
    c->precision = KILN_PRECISION_F32;
}

/* The keys whose unset value means something (the dataset's width, no time split, no purge):
 * kiln train --print-config shows them as null, and null sets them back to unset. */
static bool unsettable(const key *k) {
    return k->type == K_TIME || k->type == K_DUR || k->off == OFF(purge_rows) ||
           (k->type == K_INT &&
            (k->off == OFF(model.n_features) || k->off == OFF(model.n_outputs)));
}

static kiln_err set_key(kiln_train_config *c, const key *k, const json_t *v, const char *label) {
    char *base = (char *)c + k->off;
    if (json_is_null(v) && unsettable(k)) {
        if (k->type == K_TIME || k->type == K_DUR)
            *base = 0;
        else if (k->type == K_INT)
            *(int *)base = 0;
        else
            *(long *)base = 0;
        return KILN_OK;
    }
    switch (k->type) {
    case K_FORMAT:
        KILN_FAIL_IF(!json_is_string(v) || strcmp(json_string_value(v), KILN_MODEL_FORMAT),
                     KILN_ERR_CONFIG, "%s: config key 'format' must be \"%s\"", label,
                     KILN_MODEL_FORMAT);
        return KILN_OK;
    case K_OPTIM: {
        const char *s = json_is_string(v) ? json_string_value(v) : "";
        if (!strcmp(s, "adamw"))
            *(kiln_optim_kind *)base = KILN_OPTIM_ADAMW;
        else if (!strcmp(s, "sgd"))
            *(kiln_optim_kind *)base = KILN_OPTIM_SGD;
        else
            return kiln_fail(KILN_ERR_CONFIG,
                             "%s: config key 'optimizer' must be \"adamw\" or \"sgd\"", label);
        return KILN_OK;
    }
    case K_DEVICE: {
        const char *s = json_is_string(v) ? json_string_value(v) : "";
        if (!strcmp(s, "cpu"))
            *(kiln_train_device *)base = KILN_TRAIN_CPU;
        else if (!strcmp(s, "cuda"))
            *(kiln_train_device *)base = KILN_TRAIN_CUDA;
        else
            return kiln_fail(KILN_ERR_CONFIG, "%s: config key 'device' must be \"cpu\" or \"cuda\"",
                             label);
        return KILN_OK;
    }
    case K_PREC: {
        const char *s = json_is_string(v) ? json_string_value(v) : "";
        if (!strcmp(s, "f32"))
            *(kiln_precision *)base = KILN_PRECISION_F32;
        else if (!strcmp(s, "bf16"))
            *(kiln_precision *)base = KILN_PRECISION_BF16;
        else
            return kiln_fail(KILN_ERR_CONFIG,
                             "%s: config key 'precision' must be \"f32\" or \"bf16\"", label);
        return KILN_OK;
    }
    case K_TIME:
    case K_DUR: {
        char buf[64];
        if (json_is_integer(v))
            snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
        else if (json_is_string(v) && json_string_length(v) < sizeof buf)
            snprintf(buf, sizeof buf, "%s", json_string_value(v));
        else
            return kiln_fail(KILN_ERR_CONFIG, "%s: config key '%s' must be a string", label,
                             k->name);
        int64_t x;
        bool ok =
            !*buf || (k->type == K_TIME ? kiln_time_parse(buf, &x) : kiln_duration_parse(buf, &x));
        KILN_FAIL_IF(!ok || strlen(buf) >= (size_t)k->hi, KILN_ERR_CONFIG,
                     "%s: config key '%s' must be %s, not '%s'", label, k->name,
                     k->type == K_TIME ? "a time (1985-01-01, 1985-01-01T09:30:00Z or epoch "
                                         "seconds, in the years 0000 to 9999)"
                                       : "a duration (30d, 12h, 90m, 3600s; under 10000 years)",
                     buf);
        snprintf(base, (size_t)k->hi, "%s", buf);
        return KILN_OK;
    }
    case K_BOOL:
        KILN_FAIL_IF(!json_is_boolean(v), KILN_ERR_CONFIG,
                     "%s: config key '%s' must be true or false", label, k->name);
        *(bool *)base = json_is_true(v);
        return KILN_OK;
    case K_U64:
        KILN_FAIL_IF(!json_is_integer(v) || json_integer_value(v) < 0, KILN_ERR_CONFIG,
                     "%s: config key '%s' must be a non-negative integer", label, k->name);
        *(uint64_t *)base = (uint64_t)json_integer_value(v);
        return KILN_OK;
    case K_INT:
    case K_LONG: {
        KILN_FAIL_IF(!json_is_integer(v), KILN_ERR_CONFIG, "%s: config key '%s' must be an integer",
                     label, k->name);
        json_int_t x = json_integer_value(v);
        KILN_FAIL_IF((double)x < k->lo || (double)x > k->hi, KILN_ERR_CONFIG,
                     "%s: config key '%s' must be between %.0f and %.0f (is %lld)", label, k->name,
                     k->lo, k->hi, (long long)x);
        if (k->type == K_INT)
            *(int *)base = (int)x;
        else
            *(long *)base = (long)x;
        return KILN_OK;
    }
    case K_DBL:
    case K_FLT: {
        KILN_FAIL_IF(!json_is_number(v), KILN_ERR_CONFIG, "%s: config key '%s' must be a number",
                     label, k->name);
        double x = json_number_value(v);
        bool ok = isfinite(x) && (k->lo_open ? x > k->lo : x >= k->lo) &&
                  (k->hi_open ? x < k->hi : x <= k->hi);
        KILN_FAIL_IF(!ok, KILN_ERR_CONFIG, "%s: config key '%s' must be in %s%g, %g%s (is %g)",
                     label, k->name, k->lo_open ? "(" : "[", k->lo, k->hi, k->hi_open ? ")" : "]",
                     x);
        if (k->type == K_FLT)
            *(float *)base = (float)x;
        else
            *(double *)base = x;
        return KILN_OK;
    }
    }
    return kiln_fail(KILN_ERR_INTERNAL, "bad key type");
}

kiln_err kiln_train_config_apply(kiln_train_config *c, const json_t *j, const char *label) {
    KILN_FAIL_IF(!json_is_object(j), KILN_ERR_CONFIG, "%s: the config is not a JSON object", label);
    const char *name;
    json_t *v;
    json_object_foreach((json_t *)j, name, v) {
        const key *k = find_key(name);
        if (!k) {
            char hint[700];
            kiln_name_hint(name, keys, KILN_ARRAY_LEN(keys), sizeof keys[0], "config keys", hint,
                           sizeof hint);
            return kiln_fail(KILN_ERR_CONFIG, "%s: unknown config key '%s'%s", label, name, hint);
        }
        KILN_TRY(set_key(c, k, v, label));
    }
    return KILN_OK;
}

kiln_err kiln_train_config_set(kiln_train_config *c, const char *assignment) {
    const char *eq = strchr(assignment, '=');
    KILN_FAIL_IF(!eq || eq == assignment, KILN_ERR_USAGE, "--set '%s': expected key=value",
                 assignment);
    char name[64];
    size_t n = (size_t)(eq - assignment);
    KILN_FAIL_IF(n >= sizeof name, KILN_ERR_CONFIG, "--set '%s': unknown config key", assignment);
    memcpy(name, assignment, n);
    name[n] = 0;
    const key *k = find_key(name);
    if (!k) {
        char hint[700];
        kiln_name_hint(name, keys, KILN_ARRAY_LEN(keys), sizeof keys[0], "config keys", hint,
                       sizeof hint);
        return kiln_fail(KILN_ERR_CONFIG, "--set '%s': unknown config key '%s'%s", assignment, name,
                         hint);
    }
    const char *text = eq + 1;
    json_error_t je;
    json_t *v = json_loads(text, JSON_DECODE_ANY, &je);
    if (!v || json_is_object(v) || json_is_array(v)) {
        json_decref(v);
        v = json_string(text); /* a bare word: optimizer=sgd */
        KILN_FAIL_IF(!v, KILN_ERR_CONFIG, "--set '%s': the value is not valid UTF-8", assignment);
    }
    char label[96];
    snprintf(label, sizeof label, "--set %s", name);
    kiln_err rc = set_key(c, k, v, label);
    json_decref(v);
    return rc;
}

kiln_err kiln_train_config_check(const kiln_train_config *c, const char *label) {
    KILN_FAIL_IF(c->min_lr > c->lr, KILN_ERR_CONFIG,
                 "%s: config key 'min_lr' (%g) is larger than 'lr' (%g)", label, c->min_lr, c->lr);
    KILN_FAIL_IF(c->precision == KILN_PRECISION_BF16 && c->device != KILN_TRAIN_CUDA,
                 KILN_ERR_CONFIG,
                 "%s: config key 'precision' is \"bf16\", which only device \"cuda\" has (the "
                 "CPU trains in f32)",
                 label);
    kiln_model_config m = c->model;
    if (!m.n_features) m.n_features = 1; /* the dataset's, checked once known */
    if (!m.n_outputs) m.n_outputs = 1;
    KILN_TRY(kiln_model_config_check(&m, label));
    return KILN_OK;
}

const char *kiln_train_device_name(kiln_train_device d) {
    return d == KILN_TRAIN_CUDA ? "cuda" : "cpu";
}

bool kiln_train_config_resumable(const char *name) {
    const key *k = find_key(name);
    return k && k->resumable;
}

json_t *kiln_train_config_json(const kiln_train_config *c) {
    json_t *j = json_object();
    if (!j) return NULL;
    for (size_t i = 0; i < KILN_ARRAY_LEN(keys); i++) {
        const key *k = &keys[i];
        const char *base = (const char *)c + k->off;
        json_t *v = NULL;
        switch (k->type) {
        case K_FORMAT:
            v = json_string(KILN_MODEL_FORMAT);
            break;
        case K_OPTIM:
            v = json_string(*(const kiln_optim_kind *)base == KILN_OPTIM_SGD ? "sgd" : "adamw");
            break;
        case K_DEVICE:
            v = json_string(kiln_train_device_name(*(const kiln_train_device *)base));
            break;
        case K_PREC:
            v = json_string(*(const kiln_precision *)base == KILN_PRECISION_BF16 ? "bf16" : "f32");
            break;
        case K_BOOL:
            v = json_boolean(*(const bool *)base);
            break;
        case K_TIME:
        case K_DUR:
            if (!*base) continue; /* unset: configs from before these keys keep their text */
            v = json_string(base);
            break;
        case K_U64:
            v = json_integer((json_int_t) * (const uint64_t *)base);
            break;
        case K_INT:
            if ((k->off == OFF(model.n_features) || k->off == OFF(model.n_outputs)) &&
                !*(const int *)base)
                continue;
            v = json_integer(*(const int *)base);
            break;
        case K_LONG:
            if (k->off == OFF(purge_rows) && !c->purge_rows) continue; /* unset, as K_TIME */
            v = json_integer(*(const long *)base);
            break;
        case K_DBL:
            v = json_real(*(const double *)base);
            break;
        case K_FLT: {
            /* The shortest decimal that reads back as the same float. */
            char buf[32];
            float f = *(const float *)base;
            for (int p = 6; p <= 9; p++) {
                snprintf(buf, sizeof buf, "%.*g", p, (double)f);
                if ((float)strtod(buf, NULL) == f) break;
            }
            v = json_real(strtod(buf, NULL));
            break;
        }
        }
        if (!v || json_object_set_new(j, k->name, v)) {
            json_decref(j);
            return NULL;
        }
    }
    return j;
}

/* Digits that make every real in j read back exactly: the fewest that do for all. */
int kiln_train_json_precision(const json_t *j) {
    int need = 1;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)j, k, v) {
        if (!json_is_real(v)) continue;
        double x = json_real_value(v);
        int p = 1;
        char buf[40];
        for (; p < 17; p++) {
            snprintf(buf, sizeof buf, "%.*g", p, x);
            if (strtod(buf, NULL) == x) break;
        }
        if (p > need) need = p;
    }
    return need;
}

static char *config_text(json_t *j, bool pretty) {
    if (!j) {
        kiln_fail(KILN_ERR_NOMEM, "out of memory");
        return NULL;
    }
    size_t flags = JSON_SORT_KEYS | JSON_REAL_PRECISION(kiln_train_json_precision(j)) |
                   (pretty ? JSON_INDENT(2) : JSON_COMPACT);
    char *s = json_dumps(j, flags);
    json_decref(j);
    if (s && pretty) {
        size_t n = strlen(s);
        char *t = realloc(s, n + 2);
        if (!t) {
            free(s);
            s = NULL;
        } else {
            s = t;
            s[n] = '\n';
            s[n + 1] = 0;
        }
    }
    if (!s) kiln_fail(KILN_ERR_NOMEM, "out of memory");
    return s;
}

kiln_err kiln_train_split_opts(const kiln_train_config *c, kiln_split_opts *o) {
    *o = (kiln_split_opts){.val_fraction = c->val_fraction,
                           .seq_len = c->model.seq_len,
                           .val_from = c->val_from,
                           .purge_rows = c->purge_rows};
    KILN_FAIL_IF(*c->purge_time && !kiln_duration_parse(c->purge_time, &o->purge_secs),
                 KILN_ERR_CONFIG, "config key 'purge_time' '%s' is not a duration", c->purge_time);
    return KILN_OK;
}

char *kiln_train_config_text(const kiln_train_config *c, bool pretty) {
    return config_text(kiln_train_config_json(c), pretty);
}

char *kiln_train_config_print_text(const kiln_train_config *c) {
    json_t *j = kiln_train_config_json(c);
    for (size_t i = 0; j && i < KILN_ARRAY_LEN(keys); i++)
        if (!json_object_get(j, keys[i].name) && unsettable(&keys[i]) &&
            json_object_set_new(j, keys[i].name, json_null())) {
            json_decref(j);
            j = NULL;
        }
    return config_text(j, true);
}

char *kiln_train_config_run_text(const kiln_train_config *c) {
    json_t *j = kiln_train_config_json(c);
    if (j) json_object_del(j, "threads");
    return config_text(j, false);
}

int kiln_train_threads(const kiln_train_config *c) {
    if (c->threads > 0) return c->threads;
    cpu_set_t set;
    int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    return n > 0 ? n : 1;
}
