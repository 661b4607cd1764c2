/*
 * csv.c - import a CSV file into a dataset. The file is cut into fields by libcsv (Debian's
 * libcsv, RFC 4180 in strict mode: quoted fields with embedded commas, quotes and line
 * breaks, "\n" or "\r\n" line ends, spaces and tabs around unquoted fields ignored), fed a
 * physical line at a time so that every error names the line; libcsv itself keeps only the
 * field it is reading. A header row of names comes first; a UTF-8 byte-order mark before it
 * is ignored, empty lines are skipped. Only the chosen columns are converted, to f32; the
 * others (a date, a name) may hold anything.
 */
#include <csv.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "data.h"

/* realloc that fails where kiln_malloc would (kiln_alloc_fail_after), so that the
 * allocation-failure tests reach every growth, libcsv's field buffer's included. */
static void *grow(void *p, size_t n) {
    void *probe = kiln_malloc(1);
    if (!probe) return NULL;
    free(probe);
    return realloc(p, n);
}

typedef struct {
    float *v;
    size_t n, cap;
} fvec;

static bool fvec_push(fvec *a, float x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 4096;
        float *v = grow(a->v, cap * sizeof *v);
        if (!v) return false;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return true;
}

typedef struct {
    int64_t *v;
    size_t n, cap;
} ivec;

static bool ivec_push(ivec *a, int64_t x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 4096;
        int64_t *v = grow(a->v, cap * sizeof *v);
        if (!v) return false;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return true;
}

/* Group names to indices in order of first appearance: open addressing on FNV-1a. */
typedef struct groups {
    char **names; /* [n] */
    int n, cap;
    int *slot; /* [nslot] index + 1, 0 = empty */
    size_t nslot;
    size_t *last_line; /* [n] the line of the group's last row kept */
    int64_t *last_time;
    float *prev; /* [n * nsel] the group's last row kept, for ffill */
} groups;

static uint64_t fnv(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* The index of name, added when new (-1: out of memory). */
static int group_id(groups *g, const char *name, int nsel) {
    if (2 * (size_t)g->n + 2 > g->nslot) {
        size_t ns = g->nslot ? 2 * g->nslot : 64;
        int *sl = kiln_calloc(ns, sizeof *sl);
        if (!sl) return -1;
        for (int i = 0; i < g->n; i++) {
            size_t k = fnv(g->names[i]) & (ns - 1);
            while (sl[k])
                k = (k + 1) & (ns - 1);
            sl[k] = i + 1;
        }
        free(g->slot);
        g->slot = sl;
        g->nslot = ns;
    }
    size_t k = fnv(name) & (g->nslot - 1);
    for (; g->slot[k]; k = (k + 1) & (g->nslot - 1))
        if (!strcmp(g->names[g->slot[k] - 1], name)) return g->slot[k] - 1;
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 16;
        char **nm = grow(g->names, (size_t)cap * sizeof *nm);
        if (!nm) return -1;
        g->names = nm;
        size_t *ll = grow(g->last_line, (size_t)cap * sizeof *ll);
        if (!ll) return -1;
        g->last_line = ll;
        int64_t *lt = grow(g->last_time, (size_t)cap * sizeof *lt);
        if (!lt) return -1;
        g->last_time = lt;
        float *pv = grow(g->prev, (size_t)cap * (size_t)nsel * sizeof *pv);
        if (!pv) return -1;
        g->prev = pv;
        g->cap = cap;
    }
    if (!(g->names[g->n] = kiln_strdup(name))) return -1;
    g->last_line[g->n] = 0;
    for (int i = 0; i < nsel; i++)
        g->prev[(size_t)g->n * (size_t)nsel + (size_t)i] = NAN;
    g->slot[k] = ++g->n;
    return g->n - 1;
}

static void groups_free(groups *g) {
    for (int i = 0; i < g->n; i++)
        free(g->names[i]);
    free(g->names);
    free(g->slot);
    free(g->last_line);
    free(g->last_time);
    free(g->prev);
}

typedef struct reader {
    const kiln_csv_import *o;
    const char *path;
    int nsel;           /* features then targets */
    const char **names; /* [nsel] */
    bool header;        /* still reading the header row */
    char **hdr;         /* the header's names while it is read */
    int ncols, hcap;
    int *sel;                /* [ncols]: which chosen column header column c is, or -1 */
    size_t line;             /* the physical line being fed, 1-based */
    int field;               /* fields seen of the record being read */
    float *row;              /* [nsel] the record's values; NAN marks a missing one */
    int time_col, group_col; /* header columns of --time and --group, or -1 */
    bool have_time;
    int64_t row_time;
    char *row_group; /* the record's group name */
    groups g;        /* one group (index 0, no name) without --group */
    ivec times, gids;
    char *scratch; /* one field as a C string */
    size_t scap;
    fvec fx, ty;
    kiln_csv_report rep;
    kiln_err rc; /* the first error: libcsv's callbacks cannot return one */
} reader;

static bool fail(reader *r, kiln_err rc, const char *fmt, ...) KILN_PRINTF(3, 4);
static bool fail(reader *r, kiln_err rc, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->rc = kiln_fail(rc, "%s", msg);
    return false;
}

/* The field as a NUL-terminated string in r->scratch, spaces and tabs around it dropped
 * (libcsv drops them around unquoted fields; a quoted " 1.5" is the same number). */
static char *field_text(reader *r, const char *s, size_t len) {
    if (len + 1 > r->scap) {
        size_t cap = len + 1 > 2 * r->scap ? len + 1 : 2 * r->scap;
        char *p = grow(r->scratch, cap);
        if (!p) {
            fail(r, KILN_ERR_NOMEM, "out of memory importing '%s' (line %zu)", r->path, r->line);
            return NULL;
        }
        r->scratch = p;
        r->scap = cap;
    }
    while (len && (*s == ' ' || *s == '\t'))
        s++, len--;
    while (len && (s[len - 1] == ' ' || s[len - 1] == '\t'))
        len--;
    memcpy(r->scratch, s, len);
    r->scratch[len] = 0;
    return r->scratch;
}

/* The least magnitude that rounds to infinity in f32: FLT_MAX and half its last step (2^104;
 * a tie rounds to the even neighbour, 2^128). What is below rounds to at most FLT_MAX, so
 * that 3.40282347e+38, which kiln data export writes for FLT_MAX, reads back as FLT_MAX:
 * comparing the double with FLT_MAX before rounding refused it. */
#define F32_OVERFLOW ((double)FLT_MAX + 0x1p103)

/* What R, pandas and spreadsheets write for a value that is not there. */
static bool is_missing(const char *s) {
    return !*s || !strcmp(s, "NA") || !strcasecmp(s, "nan");
}

static void value(reader *r, int i, const char *s) {
    const char *col = r->names[i];
    if (is_missing(s)) {
        if (r->o->missing == KILN_MISSING_REFUSE)
            fail(r, KILN_ERR_FORMAT,
                 "'%s' line %zu, column '%s': missing value%s%s%s (the first one; --missing "
                 "drop|ffill|zero accepts them)",
                 r->path, r->line, col, *s ? " '" : " (empty)", s, *s ? "'" : "");
        r->row[i] = NAN;
        return;
    }
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (end == s || *end)
        fail(r, KILN_ERR_FORMAT, "'%s' line %zu, column '%s': '%s' is not a number", r->path,
             r->line, col, s);
    else if (!isfinite(d))
        fail(r, KILN_ERR_NUMERIC, "'%s' line %zu, column '%s': '%s' is not finite", r->path,
             r->line, col, s);
    else if (fabs(d) >= F32_OVERFLOW)
        fail(r, KILN_ERR_NUMERIC, "'%s' line %zu, column '%s': '%s' is out of range for f32",
             r->path, r->line, col, s);
    else /* rounded to f32 as the conversion would: FLT_MAX past it, up to half a step */
        r->row[i] = fabs(d) <= FLT_MAX ? (float)d : d > 0 ? FLT_MAX : -FLT_MAX;
}

static void on_field(void *s, size_t len, void *data) {
    reader *r = data;
    if (r->rc) return;
    if (memchr(s, 0, len)) {
        fail(r, KILN_ERR_FORMAT, "'%s' line %zu: a NUL byte%s", r->path, r->line,
             r->header ? " (is the file UTF-16? kiln reads UTF-8 or ASCII)" : "");
        return;
    }
    int c = r->field++;
    if (r->header) {
        if (r->ncols == r->hcap) {
            int cap = r->hcap ? 2 * r->hcap : 16;
            char **h = grow(r->hdr, (size_t)cap * sizeof *h);
            if (!h) {
                fail(r, KILN_ERR_NOMEM, "out of memory importing '%s'", r->path);
                return;
            }
            r->hdr = h;
            r->hcap = cap;
        }
        char *t = field_text(r, s, len);
        if (!t) return;
        if (!(r->hdr[r->ncols] = kiln_strdup(t))) {
            fail(r, KILN_ERR_NOMEM, "out of memory importing '%s'", r->path);
            return;
        }
        r->ncols++;
        return;
    }
    if (c >= r->ncols) return;
    if (c == r->time_col) {
        char *t = field_text(r, s, len);
        if (!t) return;
        if (!*t)
            fail(r, KILN_ERR_FORMAT, "'%s' line %zu, column '%s': the time is missing", r->path,
                 r->line, r->o->time_column);
        else if (!kiln_time_parse(t, &r->row_time))
            fail(r, KILN_ERR_FORMAT,
                 "'%s' line %zu, column '%s': '%s' is not a time (an ISO 8601 date or date-time, "
                 "or epoch seconds, in the years 0000 to 9999)",
                 r->path, r->line, r->o->time_column, t);
        r->have_time = true;
        return;
    }
    if (c == r->group_col) {
        char *t = field_text(r, s, len);
        if (!t) return;
        size_t n = strlen(t), ok = kiln_utf8_valid_prefix(t, n);
        if (ok != n) {
            /* The names go into the dataset's JSON metadata, which holds UTF-8 only: taken,
             * the file written did not open ("tensor 'group' row 2 is 2"). */
            fail(r, KILN_ERR_FORMAT,
                 "'%s' line %zu, column '%s': the group name is not valid UTF-8 (byte %zu of "
                 "the field is 0x%02X)",
                 r->path, r->line, r->o->group_column, ok + 1, (unsigned char)t[ok]);
            return;
        }
        free(r->row_group);
        if (!(r->row_group = kiln_strdup(t)))
            fail(r, KILN_ERR_NOMEM, "out of memory importing '%s'", r->path);
        return;
    }
    if (r->sel[c] < 0) return;
    char *t = field_text(r, s, len);
    if (t) value(r, r->sel[c], t);
}

/* The header is read: find each chosen column. */
static void header_done(reader *r) {
    r->header = false;
    if (!(r->sel = kiln_calloc((size_t)r->ncols, sizeof *r->sel))) {
        fail(r, KILN_ERR_NOMEM, "out of memory importing '%s'", r->path);
        return;
    }
    for (int c = 0; c < r->ncols; c++)
        r->sel[c] = -1;
    for (int i = 0; i < r->nsel; i++) {
        int at = -1;
        for (int c = 0; c < r->ncols; c++) {
            if (strcmp(r->hdr[c], r->names[i])) continue;
            if (at >= 0) {
                fail(r, KILN_ERR_FORMAT,
                     "'%s' line 1: column '%s' appears twice in the header (columns %d and %d)",
                     r->path, r->names[i], at + 1, c + 1);
                return;
            }
            at = c;
        }
        if (at < 0) {
            fail(r, KILN_ERR_NOTFOUND, "'%s' line 1: no column '%s' in the header", r->path,
                 r->names[i]);
            return;
        }
        r->sel[at] = i;
    }
    const char *extra[2] = {r->o->time_column, r->o->group_column};
    int *col[2] = {&r->time_col, &r->group_col};
    for (int k = 0; k < 2; k++) {
        *col[k] = -1;
        if (!extra[k]) continue;
        for (int c = 0; c < r->ncols; c++) {
            if (strcmp(r->hdr[c], extra[k])) continue;
            if (*col[k] >= 0) { /* not the last one silently: as for the chosen features */
                fail(r, KILN_ERR_FORMAT,
                     "'%s' line 1: column '%s' appears twice in the header (columns %d and %d)",
                     r->path, extra[k], *col[k] + 1, c + 1);
                return;
            }
            *col[k] = c;
        }
        if (*col[k] < 0) {
            fail(r, KILN_ERR_NOTFOUND, "'%s' line 1: no column '%s' in the header", r->path,
                 extra[k]);
            return;
        }
        if (r->sel[*col[k]] >= 0 || (k == 1 && r->group_col == r->time_col)) {
            fail(r, KILN_ERR_USAGE, "'%s': column '%s' is chosen twice", r->path, extra[k]);
            return;
        }
    }
}

/* A data row is complete: apply the missing-value policy and keep it. */
static void keep_row(reader *r) {
    const int F = r->o->n_features;
    int gid = group_id(&r->g, r->row_group ? r->row_group : "", r->nsel);
    if (gid < 0) {
        fail(r, KILN_ERR_NOMEM, "out of memory importing '%s'", r->path);
        return;
    }
    float *prev = r->g.prev + (size_t)gid * (size_t)r->nsel;
    if (r->time_col >= 0) {
        size_t ll = r->g.last_line[gid];
        if (ll && r->row_time < r->g.last_time[gid]) {
            char a[32], b[32];
            kiln_time_format(r->row_time, a);
            kiln_time_format(r->g.last_time[gid], b);
            fail(r, KILN_ERR_FORMAT,
                 "'%s' line %zu, column '%s': the time goes backwards (%s after %s on line "
                 "%zu%s%s%s)",
                 r->path, r->line, r->o->time_column, a, b, ll, r->row_group ? ", group '" : "",
                 r->row_group ? r->row_group : "", r->row_group ? "'" : "");
            return;
        }
    }
    int missing = 0;
    for (int i = 0; i < r->nsel; i++)
        missing += isnan(r->row[i]);
    r->rep.rows_read++;
    if (missing) {
        switch (r->o->missing) {
        case KILN_MISSING_DROP:
            r->rep.rows_dropped++;
            return;
        case KILN_MISSING_ZERO:
            for (int i = 0; i < r->nsel; i++)
                if (isnan(r->row[i])) r->row[i] = 0;
            break;
        case KILN_MISSING_FFILL:
            for (int i = 0; i < r->nsel; i++) {
                if (!isnan(r->row[i])) continue;
                if (isnan(prev[i])) {
                    fail(r, KILN_ERR_FORMAT,
                         "'%s' line %zu, column '%s': missing value with no earlier value to "
                         "carry forward (--missing drop drops the row instead)",
                         r->path, r->line, r->names[i]);
                    return;
                }
                r->row[i] = prev[i];
            }
            break;
        default: /* refused as it was read */
            return;
        }
        r->rep.rows_filled++;
        r->rep.values_filled += (size_t)missing;
    }
    for (int i = 0; i < r->nsel; i++) {
        prev[i] = r->row[i];
        if (!fvec_push(i < F ? &r->fx : &r->ty, r->row[i])) {
            fail(r, KILN_ERR_NOMEM, "out of memory importing '%s' (line %zu)", r->path, r->line);
            return;
        }
    }
    if ((r->time_col >= 0 && !ivec_push(&r->times, r->row_time)) ||
        (r->group_col >= 0 && !ivec_push(&r->gids, gid))) {
        fail(r, KILN_ERR_NOMEM, "out of memory importing '%s' (line %zu)", r->path, r->line);
        return;
    }
    r->g.last_line[gid] = r->line;
    r->g.last_time[gid] = r->row_time;
    r->rep.rows++;
}

static void on_row(int term, void *data) {
    reader *r = data;
    int n = r->field;
    r->field = 0;
    if (r->rc) return;
    if (r->header) {
        header_done(r);
    } else if (n != r->ncols) {
        if (n < r->ncols)
            fail(r, KILN_ERR_FORMAT,
                 "'%s' line %zu: %d fields, but the header has %d (column %d "
                 "'%s' is missing)",
                 r->path, r->line, n, r->ncols, n + 1, r->hdr[n]);
        else
            fail(r, KILN_ERR_FORMAT, "'%s' line %zu, column %d: %d fields, but the header has %d",
                 r->path, r->line, r->ncols + 1, n, r->ncols);
    } else {
        keep_row(r);
    }
    for (int i = 0; i < r->nsel; i++)
        r->row[i] = NAN; /* a column the row lacks is not carried over */
    r->have_time = false;
    free(r->row_group);
    r->row_group = NULL;
}

/* Rows grouped, stably: group 0's rows in file order, then group 1's, ... (a counting sort
 * by group index, which is the order of first appearance). */
static kiln_err group_rows(reader *r, int32_t **gout) {
    const size_t n = r->rep.rows, G = (size_t)r->g.n, F = (size_t)r->o->n_features,
                 O = (size_t)r->o->n_outputs;
    size_t *at = kiln_calloc(G + 1, sizeof *at);
    float *fx = kiln_malloc(n * F * sizeof *fx), *ty = kiln_malloc(n * O * sizeof *ty);
    int64_t *tm = r->times.v ? kiln_malloc(n * sizeof *tm) : NULL;
    int32_t *gs = kiln_malloc(n * sizeof *gs);
    if (!at || !fx || !ty || !gs || (r->times.v && !tm)) {
        free(at), free(fx), free(ty), free(tm), free(gs);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory importing '%s'", r->path);
    }
    for (size_t i = 0; i < n; i++)
        at[r->gids.v[i] + 1]++;
    for (size_t g = 0; g < G; g++)
        at[g + 1] += at[g];
    for (size_t i = 0; i < n; i++) {
        size_t j = at[r->gids.v[i]]++;
        memcpy(fx + j * F, r->fx.v + i * F, F * sizeof *fx);
        memcpy(ty + j * O, r->ty.v + i * O, O * sizeof *ty);
        if (tm) tm[j] = r->times.v[i];
        gs[j] = (int32_t)r->gids.v[i];
    }
    free(at);
    free(r->fx.v), free(r->ty.v), free(r->times.v);
    r->fx.v = fx, r->ty.v = ty, r->times.v = tm;
    *gout = gs;
    return KILN_OK;
}

/* Where, in a line that starts outside quotes, the quoted field still open at its end
 * begins (1-based byte), for the message about a quote never closed. */
static size_t open_quote_at(const char *s, size_t n) {
    bool inq = false, start = true;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (inq) {
            if (c == '"' && i + 1 < n && s[i + 1] == '"')
                i++;
            else if (c == '"')
                inq = false;
        } else if (c == '"' && start) {
            inq = true;
            at = i + 1;
        } else if (c == ',') {
            start = true;
        } else if (c != ' ' && c != '\t') {
            start = false;
        }
    }
    return inq ? at : 0;
}

kiln_err kiln_dataset_import_csv_ex(const kiln_csv_import *o, kiln_csv_report *report) {
    const char *csv = o->csv_path;
    if (report) memset(report, 0, sizeof *report);
    KILN_FAIL_IF(o->n_features < 1 || o->n_outputs < 1, KILN_ERR_USAGE,
                 "'%s': import needs at least one feature and one target", csv);
    KILN_FAIL_IF(o->missing < KILN_MISSING_REFUSE || o->missing > KILN_MISSING_ZERO, KILN_ERR_USAGE,
                 "'%s': unknown missing-value policy %d", csv, (int)o->missing);
    /* Before the CSV is read: --out naming the CSV itself, or any file not a dataset. */
    KILN_TRY(kiln_dataset_out_ok(o->out_path));
    reader r = {.o = o,
                .path = csv,
                .nsel = o->n_features + o->n_outputs,
                .header = true,
                .time_col = -1,
                .group_col = -1};
    int32_t *gs = NULL;
    struct csv_parser p;
    bool parser = false;
    char *line = NULL;
    size_t cap = 0, quote_line = 0, quote_col = 0;
    json_t *cols = NULL;
    kiln_err rc = KILN_OK;
    FILE *f = NULL;
    r.names = kiln_calloc((size_t)r.nsel, sizeof *r.names);
    r.row = kiln_malloc((size_t)r.nsel * sizeof *r.row);
    KILN_CHECK_IF(rc, out, !r.names || !r.row, KILN_ERR_NOMEM, "out of memory importing '%s'", csv);
    const char *named[2] = {o->time_column, o->group_column};
    for (int i = 0; i < r.nsel + 2; i++) {
        const char *nm = i < r.nsel
                             ? (i < o->n_features ? o->features[i] : o->targets[i - o->n_features])
                             : named[i - r.nsel];
        KILN_CHECK_IF(rc, out, nm && kiln_utf8_valid_prefix(nm, strlen(nm)) != strlen(nm),
                      KILN_ERR_USAGE, "'%s': column name '%s' is not valid UTF-8", csv, nm);
    }
    for (int i = 0; i < r.nsel; i++) {
        r.names[i] = i < o->n_features ? o->features[i] : o->targets[i - o->n_features];
        r.row[i] = NAN;
        for (int j = 0; j < i; j++)
            KILN_CHECK_IF(rc, out, !strcmp(r.names[i], r.names[j]), KILN_ERR_USAGE,
                          "'%s': column '%s' is chosen twice", csv, r.names[i]);
    }
    int fd;
    KILN_CHECK(rc, out, kiln_open_input(csv, &fd, NULL));
    f = fdopen(fd, "r");
    if (!f) {
        rc = kiln_fail_errno(KILN_ERR_NOMEM, "cannot read '%s'", csv);
        close(fd);
        goto out;
    }
    KILN_CHECK_IF(rc, out, csv_init(&p, CSV_STRICT | CSV_STRICT_FINI) != 0, KILN_ERR_NOMEM,
                  "out of memory importing '%s'", csv);
    parser = true;
    /* libcsv's buffer grows through kiln's allocator, so allocation-failure tests reach it. */
    csv_set_realloc_func(&p, grow);
    csv_set_free_func(&p, free);

    ssize_t len;
    while (!r.rc && (len = getline(&line, &cap, f)) >= 0) {
        r.line++;
        const char *s = line;
        size_t n = (size_t)len, skip = 0;
        if (r.line == 1 && n >= 3 && !memcmp(s, "\xEF\xBB\xBF", 3)) skip = 3;
        bool was_quoted = p.quoted;
        /* libcsv grows its field buffer by blk_size at a time (128 bytes unless told): a
         * 200 MiB field took 1.6 million reallocs of a growing block, 130 s. A step of at least
         * this line and at least the buffer so far makes one growth per line and doubling
         * across lines: linear. */
        size_t have = csv_get_buffer_size(&p), step = n > have ? n : have;
        csv_set_blk_size(&p, step > 128 ? step : 128);
        size_t used = csv_parse(&p, s + skip, n - skip, on_field, on_row, &r);
        if (r.rc) break;
        if (used < n - skip) {
            KILN_CHECK_IF(rc, out, csv_error(&p) == CSV_ENOMEM || csv_error(&p) == CSV_ETOOBIG,
                          KILN_ERR_NOMEM, "out of memory importing '%s' (line %zu)", csv, r.line);
            rc = kiln_fail(KILN_ERR_FORMAT,
                           "'%s' line %zu, column %zu: bad quoting (a quote inside an unquoted "
                           "field, or text after a closing quote; write a quote inside a quoted "
                           "field as \"\")",
                           csv, r.line, skip + used + 1);
            goto out;
        }
        if (p.quoted && !was_quoted) {
            quote_line = r.line;
            quote_col = skip + open_quote_at(s + skip, n - skip);
        }
    }
    if (!r.rc) {
        KILN_CHECK_IF(rc, out, ferror(f), KILN_ERR_IO, "cannot read '%s' (after line %zu)", csv,
                      r.line);
        if (csv_fini(&p, on_field, on_row, &r) != 0 && !r.rc) {
            KILN_CHECK_IF(rc, out, csv_error(&p) != CSV_EPARSE, KILN_ERR_NOMEM,
                          "out of memory importing '%s'", csv);
            rc = kiln_fail(KILN_ERR_FORMAT,
                           "'%s' line %zu, column %zu: a quoted field is not closed by the end "
                           "of the file",
                           csv, quote_line ? quote_line : r.line, quote_col ? quote_col : 1);
            goto out;
        }
    }
    if ((rc = r.rc)) goto out;
    KILN_CHECK_IF(rc, out, r.header, KILN_ERR_FORMAT, "'%s': %s", csv,
                  r.line ? "no header row (only empty lines)" : "empty file (no header row)");
    KILN_CHECK_IF(rc, out, r.rep.rows_read == 0, KILN_ERR_FORMAT,
                  "'%s': no data rows after the header", csv);
    KILN_CHECK_IF(rc, out, r.rep.rows == 0, KILN_ERR_FORMAT,
                  "'%s': --missing drop dropped all %zu rows", csv, r.rep.rows_dropped);
    cols = json_pack("{s:[],s:[]}", "features", "targets");
    KILN_CHECK_IF(rc, out, !cols, KILN_ERR_NOMEM, "out of memory importing '%s'", csv);
    for (int i = 0; i < r.nsel; i++)
        KILN_CHECK_IF(
            rc, out,
            json_array_append_new(json_object_get(cols, i < o->n_features ? "features" : "targets"),
                                  json_string(r.names[i])),
            KILN_ERR_NOMEM, "out of memory importing '%s'", csv);
    kiln_dataset_extra x = {
        .time = r.times.v, .time_column = o->time_column, .group_column = o->group_column};
    if (o->group_column) {
        KILN_CHECK(rc, out, group_rows(&r, &gs));
        x.time = r.times.v;
        x.group = gs;
        x.n_groups = r.g.n;
        x.group_names = (const char *const *)r.g.names;
    }
    r.rep.n_groups = o->group_column ? r.g.n : 0;
    rc = kiln_dataset_write_extra(o->out_path, r.rep.rows, o->n_features, o->n_outputs, r.fx.v,
                                  r.ty.v, cols, NULL, x.time || x.group ? &x : NULL);
    if (!rc && report) *report = r.rep;
out:
    if (parser) csv_free(&p);
    if (f) fclose(f);
    free(line);
    for (int c = 0; c < r.ncols; c++)
        free(r.hdr[c]);
    free(r.hdr);
    free(r.sel);
    free(r.names);
    free(r.row);
    free(r.row_group);
    groups_free(&r.g);
    free(r.times.v);
    free(r.gids.v);
    free(gs);
    free(r.scratch);
    free(r.fx.v);
    free(r.ty.v);
    json_decref(cols);
    return rc;
}

kiln_err kiln_dataset_import_csv(const char *csv, const char *const *features, int n_features,
                                 const char *const *targets, int n_outputs, const char *out_path) {
    kiln_csv_import o = {.csv_path = csv,
                         .out_path = out_path,
                         .features = features,
                         .n_features = n_features,
                         .targets = targets,
                         .n_outputs = n_outputs};
    return kiln_dataset_import_csv_ex(&o, NULL);
}

char *kiln_csv_header_field(const char *name) {
    bool formula = name[0] && strchr("=+-@", name[0]);
    bool quote = strpbrk(name, ",\"\r\n") != NULL;
    size_t n = strlen(name), extra = formula + (quote ? 2 : 0);
    for (const char *q = name; quote && (q = strchr(q, '"')); q++)
        extra++;
    char *out = kiln_malloc(n + extra + 1), *o = out;
    if (!out) return NULL;
    if (quote) *o++ = '"';
    if (formula) *o++ = '\'';
    for (const char *q = name; *q; q++) {
        if (*q == '"') *o++ = '"';
        *o++ = *q;
    }
    if (quote) *o++ = '"';
    *o = 0;
    return out;
}
