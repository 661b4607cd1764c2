/* reg_metrics.c - the registry server's Prometheus metrics: requests counted by route, method
 * and status, refused tokens by reason, the upload and download histograms, and GET /metrics,
 * which writes them out with the store's gauges (versions, channel expiries, a mirror's sync). */
#include <inttypes.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_int.h"

/* The histograms' upper bounds, in seconds. */
static const double bucket_le[REG_HIST_BUCKETS] = {0.01, 0.05, 0.25, 1, 5, 30, 120, 600};

static void hist_add(reg_histogram *h, double secs) {
    h->count++;
    h->sum += secs;
    for (int i = 0; i < REG_HIST_BUCKETS; i++)
        if (secs <= bucket_le[i]) h->bucket[i]++;
}

void reg_count_request(kiln_registry_server *s, reg_req *r, const char *label) {
    pthread_mutex_lock(&s->mu);
    reg_counter_row *row = NULL;
    for (size_t i = 0; i < s->nrows; i++)
        if (s->rows[i].route == r->route && s->rows[i].status == r->status &&
            !strcmp(s->rows[i].method, r->method))
            row = &s->rows[i];
    if (!row && s->nrows == s->caprows) {
        size_t cap = s->caprows ? 2 * s->caprows : 32;
        reg_counter_row *nr = realloc(s->rows, cap * sizeof *nr);
        if (nr) {
            s->rows = nr;
            s->caprows = cap;
        }
    }
    if (!row && s->nrows < s->caprows) {
        row = &s->rows[s->nrows++];
        memset(row, 0, sizeof *row);
        row->route = r->route;
        row->label = label;
        row->status = r->status;
        snprintf(row->method, sizeof row->method, "%s", r->method);
    }
    if (row) row->n++;
    double secs = (double)(kiln_now_ns() - r->t0) / 1e9;
    if (r->route == REG_R_BLOB && r->status / 100 == 2) {
        s->bytes_served += r->body_bytes;
        hist_add(&s->download, secs);
    }
    if (r->route == REG_R_VERSION && !strcmp(r->method, "PUT") && r->status / 100 == 2)
        hist_add(&s->upload, secs);
    pthread_mutex_unlock(&s->mu);
}

static void put_hist(FILE *f, const char *name, const reg_histogram *h) {
    fprintf(f, "# TYPE %s histogram\n", name);
    for (int i = 0; i < REG_HIST_BUCKETS; i++)
        fprintf(f, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, bucket_le[i], h->bucket[i]);
    fprintf(f, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n%s_sum %.6f\n%s_count %" PRIu64 "\n", name,
            h->count, name, h->sum, name, h->count);
}

/* A label value in the Prometheus text format: backslash, double quote and newline escaped
 * (\\, \", \n), everything else as it is. */
static void put_label(FILE *f, const char *v) {
    for (const char *p = v; *p; p++) {
        if (*p == '\\' || *p == '"' || *p == '\n') fputc('\\', f);
        fputc(*p == '\n' ? 'n' : *p, f);
    }
}

/* Each channel's current record's expiry (unix time), so that an alert is
 * `kiln_registry_channel_expiry_timestamp_seconds - time() < 7 * 86400`. One query over the
 * primary key (model, channel, seq): SQLite takes a bare column of a max() aggregate from the
 * row that holds the max, so expires is the current record's. A store the query fails on
 * writes no gauge (the rest of /metrics still answers). */
static void put_expiry_metrics(FILE *f, sqlite3 *db) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT model, channel, expires, max(seq) FROM channel_records"
                           " GROUP BY model, channel ORDER BY model, channel",
                           -1, &st, NULL) != SQLITE_OK)
        return;
    fprintf(f, "# HELP kiln_registry_channel_expiry_timestamp_seconds When each channel's current "
               "record expires (unix time): kiln pull refuses it from then on.\n"
               "# TYPE kiln_registry_channel_expiry_timestamp_seconds gauge\n");
    while (sqlite3_step(st) == SQLITE_ROW) {
        const char *m = (const char *)sqlite3_column_text(st, 0),
                   *c = (const char *)sqlite3_column_text(st, 1);
        if (!m || !c) continue;
        fputs("kiln_registry_channel_expiry_timestamp_seconds{model=\"", f);
        put_label(f, m);
        fputs("\",channel=\"", f);
        put_label(f, c);
        fprintf(f, "\"} %" PRId64 "\n", (int64_t)sqlite3_column_int64(st, 2));
    }
    sqlite3_finalize(st);
}

/* A mirror's sync state (mirror.c keeps it in the store's meta table). */
static void put_mirror_metrics(FILE *f, const char *of, sqlite3 *db) {
    reg_mirror_status ms;
    if (reg_mirror_status_read(db, &ms) != KILN_OK) return;
    int64_t now = kiln_unix_time();
    fprintf(f, "# HELP kiln_registry_mirror_info This registry is a read-only mirror of 'of'.\n"
               "# TYPE kiln_registry_mirror_info gauge\nkiln_registry_mirror_info{of=\"");
    put_label(f, of);
    fprintf(f,
            "\"} 1\n"
            "# HELP kiln_registry_mirror_last_sync_seconds When the last sync completed (unix "
            "time; 0: never).\n# TYPE kiln_registry_mirror_last_sync_seconds gauge\n"
            "kiln_registry_mirror_last_sync_seconds %" PRId64 "\n"
            "# HELP kiln_registry_mirror_lag_seconds Seconds since the last sync completed (-1: "
            "never synced).\n# TYPE kiln_registry_mirror_lag_seconds gauge\n"
            "kiln_registry_mirror_lag_seconds %" PRId64 "\n"
            "# HELP kiln_registry_mirror_sync_problems Items the last sync did not copy (they did "
            "not verify).\n# TYPE kiln_registry_mirror_sync_problems gauge\n"
            "kiln_registry_mirror_sync_problems %" PRId64 "\n",
            ms.last_sync, ms.last_sync ? now - ms.last_sync : -1, ms.problems);
    reg_mirror_status_release(&ms);
}

enum MHD_Result reg_do_metrics(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                               sqlite3 *db) {
    int64_t versions = -1;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "SELECT count(*) FROM versions", -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        versions = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return MHD_NO;
    pthread_mutex_lock(&s->mu);
    fprintf(f,
            "# HELP kiln_registry_requests_total Requests answered, by route, method and status.\n"
            "# TYPE kiln_registry_requests_total counter\n");
    for (size_t i = 0; i < s->nrows; i++)
        fprintf(f,
                "kiln_registry_requests_total{route=\"%s\",method=\"%s\",status=\"%u\"} %" PRIu64
                "\n",
                s->rows[i].label, s->rows[i].method, s->rows[i].status, s->rows[i].n);
    fprintf(
        f,
        "# HELP kiln_registry_bytes_served_total Archive bytes sent by blob downloads.\n"
        "# TYPE kiln_registry_bytes_served_total counter\nkiln_registry_bytes_served_total %" PRIu64
        "\n",
        s->bytes_served);
    put_hist(f, "kiln_registry_upload_duration_seconds", &s->upload);
    put_hist(f, "kiln_registry_download_duration_seconds", &s->download);
    static const char *const why[REG_AUTH_NREASONS] = {
        [REG_AUTH_MISSING] = "missing", [REG_AUTH_MALFORMED] = "malformed",
        [REG_AUTH_UNKNOWN] = "unknown", [REG_AUTH_EXPIRED] = "expired",
        [REG_AUTH_REVOKED] = "revoked", [REG_AUTH_SCOPE] = "scope"};
    fprintf(f, "# HELP kiln_registry_auth_refused_total Requests refused for their token, by "
               "reason.\n# TYPE kiln_registry_auth_refused_total counter\n");
    for (int i = 0; i < REG_AUTH_NREASONS; i++)
        fprintf(f, "kiln_registry_auth_refused_total{reason=\"%s\"} %" PRIu64 "\n", why[i],
                s->auth_refused[i]);
    pthread_mutex_unlock(&s->mu);
    fprintf(f,
            "# HELP kiln_registry_versions Versions stored.\n# TYPE kiln_registry_versions gauge\n"
            "kiln_registry_versions %" PRId64 "\n",
            versions);
    fprintf(f,
            "# HELP kiln_registry_active_connections Open HTTP connections.\n"
            "# TYPE kiln_registry_active_connections gauge\nkiln_registry_active_connections %d\n",
            atomic_load(&s->connections));
    put_expiry_metrics(f, db);
    if (s->mirror_of) put_mirror_metrics(f, s->mirror_of, db);
    if (fclose(f) != 0) {
        free(buf);
        return MHD_NO;
    }
    return reg_send_buf(c, r, 200, buf, len, "text/plain; version=0.0.4");
}

/* A refused token counts in /metrics by why; nothing is written to the store for it. */
void reg_count_refusal(kiln_registry_server *s, reg_auth_refusal why) {
    pthread_mutex_lock(&s->mu);
    s->auth_refused[why]++;
    pthread_mutex_unlock(&s->mu);
}
