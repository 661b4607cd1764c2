/* opt.c - one option parser for every command: --name value, --name=value, flags,
 * repeatable options; unknown and duplicate options refused. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core.h"
#include "sign.h"

static void print_usage(const cli_spec *spec, FILE *f) {
    fprintf(f, "usage: %s\n", spec->usage);
    if (spec->summary) fprintf(f, "\n%s\n", spec->summary);
    if (!spec->opts || !spec->opts[0].name) return;
    fprintf(f, "\noptions:\n");
    for (const cli_opt *o = spec->opts; o->name; o++) {
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", o->name, o->metavar ? " " : "", o->metavar ? o->metavar : "");
        fprintf(f, "  %-28s %s%s\n", left, o->help ? o->help : "", o->required ? " (required)" : "");
    }
    fprintf(f, "  %-28s %s\n", "--help", "show this help");
}

int cli_usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("kiln: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 2;
}

int cli_fail(kiln_err rc) {
    const char *msg = kiln_errmsg();
    fprintf(stderr, "kiln: error: %s\n", *msg ? msg : kiln_strerror(rc));
    return rc == KILN_ERR_VERIFY ? 1 : 2;
}

static int set_value(const cli_spec *spec, const cli_opt *o, const char *v) {
    char *end;
    errno = 0;
    switch (o->kind) {
    case CLI_STR: *(const char **)o->dst = v; return 0;
    case CLI_INT: {
        long x = strtol(v, &end, 10);
        if (errno || end == v || *end) return cli_usage_error("--%s: '%s' is not an integer", o->name, v);
        *(long *)o->dst = x;
        return 0;
    }
    case CLI_U64: {
        if (*v == '-') return cli_usage_error("--%s: '%s' is not a non-negative integer", o->name, v);
        unsigned long long x = strtoull(v, &end, 10);
        if (errno || end == v || *end)
            return cli_usage_error("--%s: '%s' is not a non-negative integer", o->name, v);
        *(uint64_t *)o->dst = x;
        return 0;
    }
    case CLI_DBL: {
        double x = strtod(v, &end);
        if (errno || end == v || *end) return cli_usage_error("--%s: '%s' is not a number", o->name, v);
        *(double *)o->dst = x;
        return 0;
    }
    case CLI_MULTI: {
        cli_list *l = o->dst;
        const char **nv = realloc(l->v, (size_t)(l->n + 1) * sizeof *nv);
        if (!nv) return cli_usage_error("out of memory");
        l->v = nv;
        l->v[l->n++] = v;
        return 0;
    }
    case CLI_FLAG: break;
    }
    (void)spec;
    return cli_usage_error("--%s takes no value", o->name);
}

int cli_parse(const cli_spec *spec, int argc, char **argv, char ***pos, int *npos) {
    size_t nopts = 0;
    while (spec->opts && spec->opts[nopts].name) nopts++;
    bool *seen = calloc(nopts + 1, 1);
    char **p = calloc((size_t)argc + 1, sizeof *p);
    int n = 0, rc = 0;
    if (!seen || !p) {
        rc = cli_usage_error("out of memory");
        goto out;
    }
    bool only_pos = false;
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        if (only_pos || a[0] != '-' || a[1] != '-' ) {
            p[n++] = a;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_pos = true;
            continue;
        }
        if (strcmp(a, "--help") == 0) {
            print_usage(spec, stdout);
            rc = CLI_HELP_SHOWN;
            goto out;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const cli_opt *o = NULL;
        for (size_t k = 0; k < nopts; k++)
            if (strlen(spec->opts[k].name) == len && strncmp(spec->opts[k].name, name, len) == 0) o = &spec->opts[k];
        if (!o) {
            rc = cli_usage_error("unknown option '--%.*s' (see '%s --help')", (int)len, name, spec->usage);
            goto out;
        }
        size_t k = (size_t)(o - spec->opts);
        if (seen[k] && o->kind != CLI_MULTI) {
            rc = cli_usage_error("option '--%s' given twice", o->name);
            goto out;
        }
        seen[k] = true;
        if (o->kind == CLI_FLAG) {
            if (eq) {
                rc = cli_usage_error("option '--%s' takes no value", o->name);
                goto out;
            }
            *(bool *)o->dst = true;
            continue;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (!v) {
            if (i + 1 >= argc) {
                rc = cli_usage_error("option '--%s' needs a value (%s)", o->name, o->metavar ? o->metavar : "value");
                goto out;
            }
            v = argv[++i];
        }
        if ((rc = set_value(spec, o, v)) != 0) goto out;
    }
    for (size_t k = 0; k < nopts; k++)
        if (spec->opts[k].required && !seen[k]) {
            rc = cli_usage_error("option '--%s' is required (see '%s --help')", spec->opts[k].name, spec->usage);
            goto out;
        }
    if (n < spec->min_pos || (spec->max_pos >= 0 && n > spec->max_pos)) {
        rc = cli_usage_error("wrong number of arguments\nusage: %s", spec->usage);
        goto out;
    }
out:
    free(seen);
    if (rc) {
        free(p);
        p = NULL;
        n = 0;
    }
    *pos = p;
    *npos = n;
    return rc;
}

bool cli_parse_args(const cli_spec *spec, int argc, char **argv, const char **args, int *status) {
    char **pos;
    int npos, rc = cli_parse(spec, argc, argv, &pos, &npos);
    *status = rc == CLI_HELP_SHOWN ? 0 : rc;
    if (rc) return false;
    for (int i = 0; i < spec->max_pos; i++)
        args[i] = i < npos ? pos[i] : NULL;
    free(pos);
    return true;
}

int cli_parse_duration_ms(const char *s, uint64_t max_ms, uint64_t *ms) {
    static const struct {
        const char *suffix;
        uint64_t ms;
    } units[] = {{"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}, {"d", 86400000}};
    if (*s < '0' || *s > '9') return -1; /* no sign, no space */
    char *end;
    errno = 0;
    unsigned long long n = strtoull(s, &end, 10);
    if (errno || end == s) return -1;
    for (size_t i = 0; i < KILN_ARRAY_LEN(units); i++)
        if (!strcmp(end, units[i].suffix)) {
            if (n == 0 || n > max_ms / units[i].ms) return 0;
            *ms = n * units[i].ms;
            return 1;
        }
    return -1;
}

bool cli_parse_secs(const char *s, int64_t *secs) {
    uint64_t ms;
    if (cli_parse_duration_ms(s, 100ULL * 365 * 86400 * 1000, &ms) != 1 || ms % 1000) return false;
    *secs = (int64_t)(ms / 1000);
    return true;
}

kiln_err cli_parse_expiry(const char *s, int64_t now, int64_t *out) {
    uint64_t ms = 0;
    int d = cli_parse_duration_ms(s, 100ULL * 365 * 86400 * 1000, &ms);
    KILN_FAIL_IF(d == 0 || (d > 0 && ms % 1000), KILN_ERR_USAGE,
                 "--expires: '%s' must be a positive duration of at most 100 years, in whole "
                 "seconds",
                 s);
    if (d > 0) {
        *out = now + (int64_t)(ms / 1000);
        return KILN_OK;
    }
    return kiln_sign_parse_time(s, "--expires (a duration like 30d, 12h, 90m or a time)", out);
}

const char *cli_jstr(const json_t *o, const char *key) {
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "?";
}

long long cli_jint(const json_t *o, const char *key) {
    return (long long)json_integer_value(json_object_get(o, key));
}

bool cli_print_registries(const json_t *j, const char *notes) {
    const json_t *regs = json_object_get(j, "registries");
    if (json_array_size(regs) <= 1) return false;
    printf("registries  %s answered, of ", cli_jstr(j, "registry"));
    size_t i;
    json_t *u;
    json_array_foreach(regs, i, u) printf("%s%s", i ? ", " : "", json_string_value(u));
    putchar('\n');
    if (notes)
        json_array_foreach(json_object_get(j, "failover"), i, u)
            printf("%s%s\n", notes, json_string_value(u));
    return true;
}

int cli_print_json(const json_t *j, size_t flags) {
    char *text = j ? json_dumps(j, flags) : NULL;
    if (!text) return cli_usage_error("out of memory");
    printf("%s\n", text);
    free(text);
    return 0;
}

void cli_clean(const char *s, size_t max, char *out, size_t size) {
    size_t n = 0, len = strlen(s);
    bool cut = len > max;
    if (cut)
        while (max && ((unsigned char)s[max] & 0xC0) == 0x80)
            max--;
    for (size_t i = 0; i < (cut ? max : len) && n + 4 < size; i++) {
        unsigned char c = (unsigned char)s[i];
        out[n++] = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    if (cut && n + 4 < size) {
        memcpy(out + n, "...", 3);
        n += 3;
    }
    out[n] = 0;
}
