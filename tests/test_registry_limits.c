/* test_registry_limits.c - what a hostile registry can make a client download, and for how
 * long (docs/registry.md, "Limits"): a declared size over the client's maximum or over what
 * the signed manifest allows is refused before a byte is downloaded, by kiln_pull, kiln_watch
 * and a mirror's sync alike, and a pull over several registries takes the model from the
 * next; a registry that trickles is cut off by the minimum rate and passed over; a pull has a
 * deadline in all; a failed pull leaves nothing in the state directory, and partial downloads
 * a killed pull left are removed once abandoned. */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "export.h"
#include "registry_fx.h"
#include "registry_int.h"
#include "test.h"
#include "testutil.h"

typedef struct lim {
    rfx reg; /* tokens: pub, prom */
    kiln_sign_seckey *rel, *p1, *p2;
    char hex[KILN_SHA256_HEX];
    uint64_t size; /* the archive's, as published */
} lim;

static void lim_free(lim *f) {
    rfx_free(&f->reg);
    kiln_sign_seckey_free(f->rel);
    kiln_sign_seckey_free(f->p1);
    kiln_sign_seckey_free(f->p2);
}

/* A registry holding demo@1.0.0 (a small real model), staging naming it. */
static bool lim_init(lim *f) {
    memset(f, 0, sizeof *f);
    char r[KILN_SIGN_PUBKEY_B64], a[KILN_SIGN_PUBKEY_B64], b[KILN_SIGN_PUBKEY_B64];
    if (!kiln_test_keypair(&f->rel, r) || !kiln_test_keypair(&f->p1, a) ||
        !kiln_test_keypair(&f->p2, b))
        return false;
    char *t = rfx_policy(r, a, b);
    bool ok = t && rfx_init(&f->reg, "reg", t, KILN_SCOPE_PUBLISH | KILN_SCOPE_PROMOTE, 4, false);
    free(t);
    if (!ok) return false;
    /* A real model (kiln_watch loads what it pulls). */
    char *archive =
        rfx_vector_archive("m", "tsmoe-dense.model.safetensors", "1.0.0", f->rel, f->hex);
    kiln_registry_client_opts c = {.url = f->reg.url, .token = f->reg.pub, .retries = 0};
    kiln_registry_published pub;
    ok = archive && kiln_registry_publish(&c, archive, NULL, &pub) == KILN_OK;
    free(archive);
    f->size = pub.size;
    kiln_sign_seckey *k1[] = {f->p1, NULL};
    char *rec =
        ok ? rfx_record("staging", "1.0.0", f->hex, 1, kiln_unix_time() + 3600, "promote", k1)
           : NULL;
    c.token = f->reg.prom;
    ok = rec && kiln_registry_put_channel(&c, "demo", "staging", rec, strlen(rec)) == KILN_OK;
    free(rec);
    return ok;
}

/* ---- a hostile registry: a proxy of the real one ---- */

typedef enum {
    LIE_HUGE,   /* declares 2^50 bytes and streams zeros */
    LIE_SIGNED, /* declares 64 MiB more than the archive: under any client maximum */
    TRICKLE     /* the truth, but the archive a byte every 200 ms */
} lie_kind;

typedef struct liar {
    const lim *f;
    lie_kind kind;
    atomic_int blobs;  /* blob requests answered */
    atomic_llong sent; /* blob bytes sent */
} liar;

static uint64_t lie_size(const liar *l) {
    return l->kind == LIE_HUGE ? (1ull << 50) : l->f->size + (64ull << 20);
}

/* Every "size" that is the archive's becomes the lie, wherever it sits in a JSON answer (the
 * model's listing, the version's document). */
static void lie_about(json_t *j, const liar *l) {
    const char *k;
    json_t *v;
    size_t i;
    if (json_is_object(j)) {
        json_object_foreach(j, k, v) {
            if (!strcmp(k, "size") && json_is_integer(v) &&
                (uint64_t)json_integer_value(v) == l->f->size)
                json_object_set_new(j, k, json_integer((json_int_t)lie_size(l)));
            else
                lie_about(v, l);
        }
    } else if (json_is_array(j)) {
        json_array_foreach(j, i, v) lie_about(v, l);
    }
}

/* Send until the client goes away or 10 s passed: len bytes of zeros every gap_ms. */
static void drip(liar *l, int c, size_t len, unsigned gap_ms, uint64_t most) {
    static const char zeros[64 * 1024];
    struct timespec gap = {gap_ms / 1000, (long)(gap_ms % 1000) * 1000000L};
    time_t until = time(NULL) + 10;
    for (uint64_t sent = 0; sent < most && time(NULL) < until;) {
        size_t k = most - sent < len ? (size_t)(most - sent) : len;
        ssize_t w = send(c, zeros, k, MSG_NOSIGNAL);
        if (w <= 0) break;
        sent += (uint64_t)w;
        atomic_fetch_add(&l->sent, w);
        if (gap_ms) nanosleep(&gap, NULL);
    }
}

static bool liar_answer(void *ctx, int c, const char *req) {
    liar *l = ctx;
    char path[1024];
    if (sscanf(req, "GET %1023s ", path) != 1) return true;
    bool blob = !strncmp(path, "/v1/blobs/", 10);
    if (blob && l->kind != TRICKLE) {
        atomic_fetch_add(&l->blobs, 1);
        char head[160];
        uint64_t n = lie_size(l);
        int hl = snprintf(head, sizeof head,
                          "HTTP/1.1 200 OK\r\nContent-Length: %llu\r\nConnection: close\r\n\r\n",
                          (unsigned long long)n);
        if (send(c, head, (size_t)hl, MSG_NOSIGNAL) == hl) drip(l, c, 64 * 1024, 0, n);
        return true;
    }
    rfx_resp r = {0};
    rfx_http(l->f->reg.url, "GET", path, NULL, NULL, NULL, &r);
    char *body = NULL;
    json_t *j = !blob && r.status == 200 ? json_loadb(r.body, r.len, 0, NULL) : NULL;
    if (j && l->kind != TRICKLE) {
        lie_about(j, l);
        body = json_dumps(j, JSON_COMPACT);
    }
    json_decref(j);
    const char *b = body ? body : r.body;
    size_t blen = body ? strlen(body) : r.len;
    char head[160];
    int hl = snprintf(head, sizeof head,
                      "HTTP/1.1 %ld X\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                      r.status, blen);
    if (send(c, head, (size_t)hl, MSG_NOSIGNAL) == hl) {
        if (blob && r.status == 200) {
            atomic_fetch_add(&l->blobs, 1);
            drip(l, c, 1, 200, blen); /* the truth, a byte every 200 ms */
        } else {
            (void)!send(c, b, blen, MSG_NOSIGNAL);
        }
    }
    free(body);
    rfx_resp_free(&r);
    return true;
}

/* ---- what a test looks at ---- */

typedef struct heard {
    char text[4096];
    size_t len;
} heard;

static void hear(void *ctx, const char *line) {
    heard *h = ctx;
    if (h->len < sizeof h->text)
        h->len += (size_t)snprintf(h->text + h->len, sizeof h->text - h->len, "%s\n", line);
}

/* The names in STATE/downloads ("" when it is absent or empty), space-separated. */
static void downloads(const char *state, char *out, size_t cap) {
    out[0] = 0;
    char *dir = kiln_path_join(state, "downloads");
    DIR *d = dir ? opendir(dir) : NULL;
    struct dirent *e;
    size_t n = 0;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "%s ", e->d_name);
    if (d) closedir(d);
    free(dir);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static kiln_pull_opts pull_opts(const lim *f, const char *const *urls, size_t n, const char *state,
                                const char *out, heard *h) {
    memset(h, 0, sizeof *h);
    kiln_pull_opts o = {.registries = urls,
                        .nregistries = n,
                        .ref = "demo@staging",
                        .trust = f->reg.trust,
                        .out = out,
                        .state = state,
                        .on_registry = hear,
                        .registry_ctx = h};
    return o;
}

/* A registry that declares 2^50 bytes (and would stream zeros) is refused before the download
 * starts, with nothing left in the state directory; so is one that declares more than the
 * signed manifest allows, and any archive over the client's max_size. With a second registry
 * the pull takes the model from it. kiln_watch and a mirror's sync refuse the same. */
KILN_TEST(registry_pull_refuses_a_huge_declared_size) {
    signal(SIGPIPE, SIG_IGN);
    lim f;
    liar l = {.f = &f, .kind = LIE_HUGE};
    rfx_stub stub = {.started = false};
    kiln_watch *w = NULL;
    if (!CHECK("a registry with demo@staging", lim_init(&f))) goto out;
    if (!CHECK("a lying proxy", rfx_stub_start(&stub, liar_answer, &l))) goto out;
    char *state = kiln_test_path("fresh-state"), *out = kiln_test_path("svc");
    char names[1024];
    heard h;
    const char *evil[] = {stub.url}, *both[] = {stub.url, f.reg.url}, *good[] = {f.reg.url};
    kiln_pull_opts o = pull_opts(&f, evil, 1, state, out, &h);
    kiln_pull_result r;
    double t0 = now_s();
    kiln_err rc = kiln_pull(&o, &r);
    double dt = now_s() - t0;
    CHECK("2^50 bytes declared: refused",
          rc == KILN_ERR_LIMIT && strstr(kiln_errmsg(), "1125899906842624 bytes") &&
              strstr(kiln_errmsg(), "more than this client accepts (17179869184 bytes"));
    CHECK("before the download started", atomic_load(&l.blobs) == 0 && atomic_load(&l.sent) == 0);
    downloads(state, names, sizeof names);
    if (!CHECK("nothing left in the state directory's downloads", !names[0]))
        fprintf(stderr, "    left: %s\n", names);
    CHECK("nothing at out", !kiln_path_exists(out));
    CHECK("at once (a hang's deadline: 10 s)", dt < 10.0);

    /* Under the client's maximum, over what the release keys signed. */
    l.kind = LIE_SIGNED;
    rc = kiln_pull(&o, &r);
    CHECK("64 MiB more than the signed manifest allows: refused",
          rc == KILN_ERR_VERIFY &&
              strstr(kiln_errmsg(), "more than an archive of its signed manifest can be") &&
              atomic_load(&l.blobs) == 0);
    downloads(state, names, sizeof names);
    CHECK("nothing left", !names[0]);

    /* The client's own maximum, against the honest registry. */
    o = pull_opts(&f, good, 1, state, out, &h);
    o.max_size = f.size - 1;
    rc = kiln_pull(&o, &r);
    CHECK("an archive over max_size: refused",
          rc == KILN_ERR_LIMIT && strstr(kiln_errmsg(), "max_size") && !kiln_path_exists(out));
    o.max_size = f.size;
    CHECK("one at max_size: pulled", kiln_pull(&o, &r) == KILN_OK && r.size == f.size);
    downloads(state, names, sizeof names);
    if (!CHECK("a pull leaves neither its download nor its lock", !names[0]))
        fprintf(stderr, "    left: %s\n", names);

    /* Failover: the liar passed over, the model from the next. */
    l.kind = LIE_HUGE;
    char *state2 = kiln_test_path("state2"), *out2 = kiln_test_path("svc2");
    o = pull_opts(&f, both, 2, state2, out2, &h);
    rc = kiln_pull(&o, &r);
    if (!CHECK("with a second registry: pulled from it, the liar passed over",
               rc == KILN_OK && !strcmp(r.version, "1.0.0") && strstr(h.text, stub.url) &&
                   strstr(h.text, "more than this client accepts")))
        fprintf(stderr, "    heard: %s", h.text);
    CHECK("the liar's blob was never asked for", atomic_load(&l.blobs) == 0);

    /* kiln_watch: the same pull, the same refusal. */
    char *wdir = kiln_test_path("watch"), *state3 = kiln_test_path("state3");
    kiln_watch_opts wo = rfx_watch_opts(&f.reg, f.reg.trust, wdir, NULL, NULL);
    wo.pull.registry = stub.url;
    wo.pull.state = state3;
    rc = kiln_watch_start(&wo, &w);
    CHECK("kiln_watch: refused at its start",
          rc == KILN_ERR_LIMIT && strstr(kiln_errmsg(), "more than this client accepts"));
    downloads(state3, names, sizeof names);
    CHECK("kiln_watch: nothing left", !names[0] && atomic_load(&l.blobs) == 0);

    /* A mirror's sync: the version is a problem, not copied, nothing downloaded. */
    char *mroot = kiln_test_path("mirror");
    kiln_registry_client_opts from = {.url = stub.url, .retries = 0};
    kiln_registry_mirror_opts mo = {.root = mroot, .from = &from, .trust = f.reg.trust};
    kiln_registry_mirror_result mr;
    rc = kiln_registry_mirror_sync(&mo, &mr);
    CHECK("a mirror's sync: the version not copied, nothing downloaded",
          rc == KILN_ERR_VERIFY && mr.versions == 0 && mr.problems >= 1 && mr.bytes == 0 &&
              atomic_load(&l.blobs) == 0);
    char *mroot2 = kiln_test_path("mirror2");
    from.url = f.reg.url;
    from.max_size = f.size - 1;
    mo.root = mroot2;
    CHECK("a mirror's max_size: the version not copied",
          kiln_registry_mirror_sync(&mo, &mr) == KILN_ERR_VERIFY && mr.versions == 0);
    from.max_size = 0;
    CHECK("without it: copied", kiln_registry_mirror_sync(&mo, &mr) == KILN_OK && mr.versions == 1);
    free(state), free(out), free(state2), free(out2), free(wdir), free(state3), free(mroot),
        free(mroot2);
out:
    kiln_watch_stop(w);
    rfx_stub_stop(&stub);
    lim_free(&f);
}

/* Partial downloads a killed pull left: resumed by the next pull of that archive; removed by
 * any pull once nobody has touched them for a day. */
KILN_TEST(registry_pull_removes_abandoned_partials) {
    lim f;
    if (!CHECK("a registry with demo@staging", lim_init(&f))) goto out;
    char *state = kiln_test_path("state"), *out = kiln_test_path("svc");
    char *dl = kiln_asprintf("%s/downloads", state);
    char *old = kiln_asprintf("%s/%064d.partial", dl, 1),
         *old_lock = kiln_asprintf("%s/%064d.lock", dl, 1),
         *fresh = kiln_asprintf("%s/%064d.partial", dl, 2);
    if (!CHECK("paths", dl && old && old_lock && fresh) || !CHECK("dir", !kiln_mkdir_p(dl)))
        goto done;
    CHECK("an old partial, its lock and a fresh partial",
          !kiln_write_file_atomic(old, "x", 1) && !kiln_write_file_atomic(old_lock, "", 0) &&
              !kiln_write_file_atomic(fresh, "y", 1));
    struct timeval two_days[2] = {{time(NULL) - 2 * 86400, 0}, {time(NULL) - 2 * 86400, 0}};
    CHECK("two days old", utimes(old, two_days) == 0 && utimes(old_lock, two_days) == 0);
    const char *good[] = {f.reg.url};
    heard h;
    kiln_pull_opts o = pull_opts(&f, good, 1, state, out, &h);
    kiln_pull_result r;
    CHECK("pulled", kiln_pull(&o, &r) == KILN_OK);
    char names[1024];
    downloads(state, names, sizeof names);
    char want[100];
    snprintf(want, sizeof want, "%064d.partial ", 2);
    if (!CHECK("the abandoned one removed, the fresh one kept", !strcmp(names, want)))
        fprintf(stderr, "    left: %s\n", names);
done:
    free(state), free(out), free(dl), free(old), free(old_lock), free(fresh);
out:
    lim_free(&f);
}

/* A registry that sends the truth a byte at a time never stalls: the minimum rate cuts it off
 * within a window (timeout_ms) and the pull takes the model from the next registry; alone, the
 * pull's deadline ends it, and nothing is left in the state directory. */
KILN_TEST(registry_pull_passes_over_a_trickling_registry) {
    signal(SIGPIPE, SIG_IGN);
    lim f;
    liar l = {.f = &f, .kind = TRICKLE};
    rfx_stub stub = {.started = false};
    if (!CHECK("a registry with demo@staging", lim_init(&f))) goto out;
    if (!CHECK("a trickling proxy", rfx_stub_start(&stub, liar_answer, &l))) goto out;
    char *state = kiln_test_path("state"), *out = kiln_test_path("svc");
    char names[1024];
    heard h;
    const char *both[] = {stub.url, f.reg.url}, *evil[] = {stub.url};
    kiln_pull_opts o = pull_opts(&f, both, 2, state, out, &h);
    o.timeout_ms = 1000;
    kiln_pull_result r;
    double t0 = now_s();
    kiln_err rc = kiln_pull(&o, &r);
    double dt = now_s() - t0;
    CHECK("pulled from the next registry", rc == KILN_OK && !strcmp(r.version, "1.0.0"));
    if (!CHECK("the trickling one passed over as too slow",
               atomic_load(&l.blobs) == 1 && strstr(h.text, stub.url) &&
                   strstr(h.text, "too slow") && strstr(h.text, "16384 bytes a second")))
        fprintf(stderr, "    heard: %s", h.text);
    CHECK("within seconds, not the trickle's 10 s (a hang's deadline)", dt < 8.0);
    downloads(state, names, sizeof names);
    CHECK("nothing left in downloads", !names[0]);

    /* Alone, with a rate it keeps up (5 bytes a second): the pull's deadline. */
    o = pull_opts(&f, evil, 1, state, out, &h);
    o.out = kiln_test_path("svc-alone");
    o.min_rate = 1;
    o.deadline_ms = 1500;
    t0 = now_s();
    rc = kiln_pull(&o, &r);
    dt = now_s() - t0;
    CHECK("alone: its deadline ends the pull",
          rc == KILN_ERR_NETWORK && strstr(kiln_errmsg(), "deadline of 1500 ms"));
    CHECK("within seconds, not the trickle's 10 s", dt < 8.0);
    downloads(state, names, sizeof names);
    if (!CHECK("the partial download removed", !names[0])) fprintf(stderr, "    left: %s\n", names);
    CHECK("nothing at out", !kiln_path_exists(o.out));
    free((char *)o.out);

    /* kiln_watch: the same pull; its start takes the model from the next registry. */
    char *wdir = kiln_test_path("watch"), *wstate = kiln_test_path("watch-state");
    kiln_watch_opts wo = rfx_watch_opts(&f.reg, f.reg.trust, wdir, NULL, NULL);
    memset(&h, 0, sizeof h);
    wo.pull.registry = NULL;
    wo.pull.registries = both;
    wo.pull.nregistries = 2;
    wo.pull.timeout_ms = 1000;
    wo.pull.state = wstate;
    wo.pull.on_registry = hear;
    wo.pull.registry_ctx = &h;
    wo.interval_ms = 600000; /* the start only */
    kiln_watch *w = NULL;
    t0 = now_s();
    rc = kiln_watch_start(&wo, &w);
    dt = now_s() - t0;
    if (!CHECK("kiln_watch: started from the next registry, the trickle passed over",
               rc == KILN_OK && strstr(h.text, stub.url) && strstr(h.text, "too slow")))
        fprintf(stderr, "    heard: %s", h.text);
    CHECK("within seconds", dt < 8.0);
    kiln_watch_stop(w);
    free(wdir), free(wstate);
    free(state), free(out);
out:
    rfx_stub_stop(&stub);
    lim_free(&f);
}

/* The signed bound holds for what kiln pack makes: incompressible weights, many small files,
 * paths ustar cannot split (a pax record each); and it is not loose (within 2% + 1 MiB). */
KILN_TEST(registry_archive_bound_holds) {
    char *dir = kiln_test_path("model"), *out = kiln_test_path("model.kiln");
    char *golden = kiln_asprintf("%s/golden", dir);
    if (!CHECK("paths", dir && out && golden && !kiln_mkdir_p(golden))) goto out;
    size_t n = 300 * 1024;
    unsigned char *w = kiln_calloc(1, n);
    char *wp = kiln_path_join(dir, "model.safetensors"), *cp = kiln_path_join(dir, "card.json");
    bool ok = w && wp && cp;
    if (ok) randombytes_buf(w, n);
    ok = ok && !kiln_write_file_atomic(wp, w, n) &&
         !kiln_write_file_atomic(cp, RFX_CARD, strlen(RFX_CARD));
    for (int i = 0; ok && i < 60; i++) {
        /* 20 of them under a path of more than 100 bytes: a pax record each */
        char *p = kiln_asprintf("%s/%s%03d.bin", golden,
                                i < 20 ? "a-name-long-enough-that-the-whole-relative-path-is-"
                                         "more-than-a-hundred-bytes-which-ustar-cannot-hold-"
                                       : "",
                                i);
        char b[700];
        randombytes_buf(b, sizeof b);
        ok = p && !kiln_write_file_atomic(p, b, (size_t)(i * 11) % sizeof b);
        free(p);
    }
    kiln_manifest *m = NULL;
    uint8_t digest[KILN_SHA256_BYTES];
    ok = ok && kiln_archive_pack(dir, "demo", "1.0.0", out, digest, &m) == KILN_OK;
    struct stat sb;
    if (CHECK("packed", ok && m && stat(out, &sb) == 0)) {
        uint64_t bound = reg_archive_bound(m), size = (uint64_t)sb.st_size;
        if (!CHECK("the archive is within the bound, and the bound not loose",
                   size <= bound && bound <= size + size / 50 + (1u << 20)))
            fprintf(stderr, "    archive %llu bytes, bound %llu\n", (unsigned long long)size,
                    (unsigned long long)bound);
    }
    kiln_manifest_free(m);
    free(w), free(wp), free(cp);
out:
    free(dir), free(out), free(golden);
}
